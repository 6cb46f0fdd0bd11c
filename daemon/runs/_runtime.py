"""The composition root of runs: the services every route and the command line call, built over
one store, one tool registry and one drive kit; and the drive that takes a run to its next
resting point.

Each service has one reason to change: ``definitions`` (the agents and graphs runs are started
from), ``reads`` (what the store says of runs), ``starts`` (new runs' heads), ``control`` (resume,
resolve, abandon), ``forks`` (a graph run's walk forked), ``uploads`` (flow members sent ahead
of their call). They share the store and the definitions; none drives a run. Driving is the
runtime's own, because it needs all of them: the definition a run names, the kit every drive is
handed, and what this daemon refuses to run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime

from salvor.protocol import (
    MAX_NESTING,
    TERMINAL_STATES,
    Envelope,
    RunFailed,
    RunView,
)

from ..agents import AgentDefinition, AgentKind, Credentials, DriveKit, drive
from ..client_runs import ClientRuns, ClientTool, DriveLeases
from ..graphs import drive_graph
from ..mcp import McpServerSpec
from ..models import ModelClients, ModelGateway
from ..proxies import ModelProxy
from ..recording import FreeSpaceFloor, StoreAccess, utc_now
from ..tools import ToolRegistry
from ._definitions import Definitions
from ._flow_host import RunFlows
from ._forks import Forks
from ._run_control import RunControl
from ._run_reads import RunReads
from ._run_starts import RunStarts
from ._run_tools import RunTools
from ._uploads import Uploads

log = logging.getLogger("salvor.runs")


class Runtime:
    """Run services over one store and one tool registry, and the drive of a run."""

    def __init__(
        self,
        access: StoreAccess,
        registry: ToolRegistry,
        *,
        clock: Callable[[], datetime] = utc_now,
        proxy: ModelProxy | None = None,
        process_restarts: int = 0,
        credentials: Credentials | None = None,
        allow_process_agents: bool = True,
        attachable_tools: frozenset[str] = frozenset(),
        attachable_mcp: Mapping[str, McpServerSpec] | None = None,
    ) -> None:
        self.access = access
        # Whether a drive may run a process or service agent at all (a daemon started without
        # --allow-process-agents may not, even one already in its store; the command line may).
        self.allow_process_agents = allow_process_agents
        credentials = credentials or Credentials()
        self.definitions = Definitions(access, registry)
        self.reads = RunReads(access, self.definitions, clock=clock, attachable_mcp=attachable_mcp)
        # What every drive of this runtime is handed; its flow host reads, starts and drives
        # child runs through this runtime's services and drive.
        self.kit = DriveKit(
            access=access,
            registry=registry,
            clock=clock,
            credentials=credentials,
            proxy=proxy,
            process_restarts=process_restarts,
            flows=RunFlows(
                self.definitions,
                self.reads,
                credentials=credentials,
                drive=self.drive,
                attachable=attachable_tools,
                attachable_mcp=attachable_mcp or {},
            ),
            model_clients=ModelClients(),
            attachable_mcp=attachable_mcp or {},
        )
        self.starts = RunStarts(access, self.definitions, self.reads, ports=self.kit.ports)
        self.control = RunControl(access, self.definitions, self.reads, clock=clock)
        self.forks = Forks(access)
        self.uploads = Uploads(access)
        self.tools = RunTools(access, self.reads, registry, attachable_mcp or {})

    async def aclose(self) -> None:
        """Close what this runtime kept between drives (its model clients); a drive still going
        closes its client when it ends."""
        if self.kit.model_clients is not None:
            await self.kit.model_clients.aclose()

    def client_runs(
        self,
        *,
        leases: DriveLeases,
        client_tools: Mapping[str, ClientTool],
        model_executor: ModelGateway | None,
        floor: FreeSpaceFloor | None = None,
    ) -> ClientRuns:
        """The client-driven runs' operations over this runtime's store, registry and resolve;
        ``floor`` refuses a new client run's head while the store's filesystem is low."""
        return ClientRuns(
            self.access,
            self.kit.registry,
            leases=leases,
            client_tools=client_tools,
            model_executor=model_executor,
            resolve=self.control.resolve,
            floor=floor,
        )

    async def drive(
        self,
        run_id: str,
        *,
        agent: AgentDefinition | None = None,
        on_record: Callable[[list[Envelope]], None] | None = None,
    ) -> RunView:
        """Drive a run to its next resting point (``agents.drive``).

        Error handling:
            A log holding a value nested deeper than Python can walk (written
            before input was bounded, or sent by a trusted peer such as a model
            or an MCP server) would crash every drive the same way; instead the
            run fails with a RunFailed saying so, and the drive returns its view.
        """
        if agent is None:
            view = await self.reads.view(run_id)
            if view.graph_hash is not None:
                return await self.drive_graph(run_id, view.graph_hash, on_record=on_record)
            agent = await self.definitions.load_agent(view.agent_def_hash)
        try:
            if agent.kind is not AgentKind.BUILTIN and not self.allow_process_agents:
                return await self._fail_not_allowed(run_id, agent)
            return await drive(self.kit, run_id, agent, on_record=on_record)
        except* RecursionError:
            pass  # answered below, outside the handler (an except* clause cannot return)
        finally:
            if agent.service is not None:
                # The claim start_run took, should the drive end before it held the port.
                self.kit.ports.release(agent.service.proxy_port, run_id)
        return await self._fail_too_deep(run_id)

    async def drive_graph(
        self,
        run_id: str,
        graph_hash: str,
        *,
        on_record: Callable[[list[Envelope]], None] | None = None,
    ) -> RunView:
        """Drive a graph run to its next resting point: its graph and agents are loaded from
        the store by the hash its head records, and whatever log it holds is walked on (a fork's
        copied prefix included).

        Raises:
            OperationRefused: unknown_graph, or an agent or tool of the graph this daemon no
                longer resolves; nothing was recorded.
        """
        flow = await self.definitions.run_flow(run_id)
        graph, files = await self.definitions.walked_graph(graph_hash, flow)
        agents = await self.definitions.graph_agents(graph)
        try:
            return await drive_graph(
                self.kit, run_id, graph, agents, on_record=on_record, files=files
            )
        except* RecursionError:
            pass  # answered below, outside the handler (an except* clause cannot return)
        return await self._fail_too_deep(run_id)

    async def _fail_not_allowed(self, run_id: str, agent: AgentDefinition) -> RunView:
        """Fail a run of a process or service agent this daemon may not run; nothing is started.

        A terminal run is left as it is.
        """
        view = await self.reads.view(run_id)
        if view.state in TERMINAL_STATES:
            return view
        what = (
            "a program it would start as its user"
            if agent.kind is AgentKind.PROCESS
            else "a service it would bind a loopback port for and send the task to"
        )
        error = (
            f"this daemon runs no {agent.kind.value} agent ({what}): it was started without "
            "--allow-process-agents; start it with that flag (and --auth-token, or on "
            "--listen unix:PATH) to run such agents"
        )
        _, view = await self.access.append(run_id, [RunFailed(error=error)], view)
        log.warning("run %s failed: %s", run_id, error, extra={"run": run_id})
        return view

    async def _fail_too_deep(self, run_id: str) -> RunView:
        """Fail a run whose log nests too deeply to drive; a terminal run is left as it is."""
        view = await self.reads.view(run_id)
        if view.state in TERMINAL_STATES:
            return view
        _, view = await self.access.append(
            run_id,
            [
                RunFailed(
                    error=(
                        "the run's log holds a value nested too deeply to drive; input a caller "
                        f"sends may nest at most {MAX_NESTING} levels"
                    )
                )
            ],
            view,
        )
        log.warning("run %s failed: its log holds a value nested too deeply to drive", run_id)
        return view
