"""The agents and graphs runs are started from, as this store holds them: building a definition
to refuse one that cannot run, registering it content-addressed, loading it back, listing them;
and edit mode, the operator's switch on whether runs may author more.

Definitions outlive the runs that name them: each is stored once under its hash and rebuilt
against this daemon's registry when the daemon first loads it, so a tool the daemon no longer
holds is refused when a run is started or driven, not halfway through it. Nothing here drives a
run.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict

import trio
from salvor.protocol import (
    ErrorCode,
    FlowBundle,
    Graph,
    GraphRunStarted,
    NodeKind,
    bundle_from_json,
    content_hash,
    excerpt,
    graph_from_value,
)
from salvor.store import GraphSummary, StoredAgent, StoredGraph

from ..agents import (
    AgentDefinition,
    AgentKind,
    DefinitionError,
    offered_besides_mcp,
    parse_definition,
)
from ..client_runs import registry_unavailable
from ..graphs import AgentParser, CheckedFlow, FlowFiles, check_flow, registry_parser
from ..mcp import McpBuildError, check_buildable, missing_program
from ..processes import MARK_VAR, store_fingerprint
from ..recording import StoreAccess
from ..tools import ToolRegistry
from ..web import OperationRefused, bad_request, unknown_agent, unknown_graph
from ._flow_names import FlowNames

# The store setting behind edit mode (0 or 1; never set reads as off).
EDIT_MODE_KEY = "flows.edit_mode"
# Loaded agent definitions kept for the next start or drive that names them (least recently
# loaded dropped first).
KEPT_AGENTS = 256


class Definitions:
    """The agents and graphs of one store, resolved against one tool registry."""

    def __init__(self, access: StoreAccess, registry: ToolRegistry) -> None:
        self.access = access
        # What a definition's tools are resolved against when it is loaded.
        self.registry = registry
        # Definitions already loaded, by hash: a stored definition never changes (its hash is its
        # text's) and the registry is fixed for the daemon's life, so loading one again would
        # build the same definition (a read and a parse, for every run started or driven).
        self._loaded: OrderedDict[str, AgentDefinition] = OrderedDict()
        # The graphs kept by name (``flow_write``, ``POST /v1/graphs?name=``).
        self.flow_names = FlowNames(access)

    # -- settings -----------------------------------------------------------

    async def edit_mode(self) -> bool:
        """Whether the operator has flow authoring on (off until it is turned on).

        Read from the store each time, never cached: a ``salvor edit-mode`` beside a daemon, or a
        second daemon on the same store, is seen at the next read.
        """
        return bool(await self.access.read(self.access.store.settings.get_setting, EDIT_MODE_KEY))

    async def set_edit_mode(self, enabled: bool) -> None:
        """Turn flow authoring on or off for every run of this store, from its next agent turn.

        Raises:
            StoreUnavailable: the database failed; the setting is as it was.
        """
        await self.access.read(self.access.store.settings.put_setting, EDIT_MODE_KEY, int(enabled))

    # -- agents -------------------------------------------------------------

    async def build_agent(self, agent: AgentDefinition) -> None:
        """Build the agent as a drive would, to refuse one that cannot run before it is stored.

        Each MCP server is started or reached, lists its tools, and is closed
        again; every tool the definition names must be there, and no two
        tools the model is offered may share a name.

        A process agent is not built: its MCP servers are the agent's own
        tools, reached through salvor's stand-ins only while it runs.

        Raises:
            OperationRefused: bad_request naming the server and why.
        """
        if agent.kind is AgentKind.PROCESS:
            # Its stdio servers are started only by a drive; a program that is
            # not there is refused now rather than failing every run later.
            for spec in agent.mcp_servers:
                if (problem := missing_program(spec, os.environ)) is not None:
                    raise bad_request(f"the agent definition does not build: {problem}")
            return
        try:
            await check_buildable(
                agent.mcp_servers,
                offered_besides_mcp(agent),
                mark={MARK_VAR: store_fingerprint(self.access.store.url)},
            )
        except McpBuildError as exc:
            raise bad_request(f"the agent definition does not build: {exc}") from None

    async def register_agent(
        self, agent: AgentDefinition, *, source_path: str | None = None
    ) -> bool:
        """Store the definition content-addressed; True when it was new. ``source_path``: the
        file it was read from on the daemon's side (the catalog lists it as local)."""
        return await self.access.read(
            lambda: self.access.store.definitions.put_agent(
                agent.agent_def_hash,
                format=agent.stored_format,
                definition=agent.stored_text,
                name=agent.name,
                source_path=source_path,
            )
        )

    async def load_agent(self, agent_def_hash: str) -> AgentDefinition:
        """Rebuild a stored definition.

        Raises:
            OperationRefused: unknown_agent when it is not stored, bad_request
                when it no longer validates here (a tool this daemon lacks).
        """
        agent = self._loaded.get(agent_def_hash)
        if agent is not None:
            self._loaded.move_to_end(agent_def_hash)
            return agent
        stored = await self.access.read(self.access.store.definitions.get_agent, agent_def_hash)
        if stored is None:
            raise unknown_agent(agent_def_hash)
        try:
            agent = parse_definition(
                stored.definition, stored.format, known_tools=self.registry.names(), stored=True
            )
        except DefinitionError as exc:
            raise bad_request(
                f"stored agent {agent_def_hash} no longer builds here: {exc}"
            ) from None
        self._loaded[agent_def_hash] = agent
        if len(self._loaded) > KEPT_AGENTS:
            self._loaded.popitem(last=False)
        return agent

    async def list_agents(self) -> list[StoredAgent]:
        """Every stored agent's row, oldest registration first."""
        return await self.access.read(self.access.store.definitions.list_agents)

    async def find_agent(self, agent_def_hash: str) -> StoredAgent | None:
        """The stored agent row, or None."""
        return await self.access.read(self.access.store.definitions.get_agent, agent_def_hash)

    # -- graphs -------------------------------------------------------------

    async def register_graph(self, graph: Graph) -> bool:
        """Store a validated graph content-addressed; True when it was new.

        Its document is kept as submitted, with its shape summary beside it. A
        failure leaves nothing stored.

        Raises:
            StoreUnavailable: the database failed.
        """
        return await self.access.read(
            lambda: self.access.store.definitions.put_graph(
                graph.hash, document=graph.document, summary=graph.summary()
            )
        )

    async def find_graph(self, graph_hash: str) -> StoredGraph | None:
        """The graph document stored under ``graph_hash``, or None."""
        return await self.access.read(self.access.store.definitions.get_graph, graph_hash)

    async def list_graphs(self) -> list[GraphSummary]:
        """Every stored graph's hash and shape summary, oldest first."""
        return await self.access.read(self.access.store.definitions.list_graphs)

    async def load_graph(self, graph_hash: str) -> Graph:
        """Rebuild a stored graph.

        Raises:
            OperationRefused: unknown_graph when it is not stored.
        """
        stored = await self.find_graph(graph_hash)
        if stored is None:
            raise unknown_graph(graph_hash)
        # Stored only after it validated, so it validates again (InvalidGraph would be a bug).
        return graph_from_value(stored.document)

    async def graph_agents(
        self, graph: Graph, *, known: dict[str, AgentDefinition] | None = None
    ) -> dict[str, AgentDefinition]:
        """Every agent ``graph``'s nodes name, by hash, once each tool node's tool is known too.

        Resolved before a graph run is started (so a run starts only when all of it
        resolves) and before each drive.

        Raises:
            OperationRefused: unknown_agent or unknown_tool naming the node
                (``details.node``), tool_registry_unavailable naming a tool node when the host
                wired no registry, or bad_request naming a node whose agent is a process or
                service agent (a graph's agent nodes run the built-in loop inline).
        """
        agents: dict[str, AgentDefinition] = {}
        for node in graph.nodes:
            call = node.body if node.kind is NodeKind.MAP else node
            if call is None:
                continue
            if call.kind is NodeKind.TOOL and not self.registry.wired:
                raise registry_unavailable(
                    f"run node {node.id!r}'s tool {excerpt(call.tool)!r}",
                    details={"node": node.id, "tool": call.tool},
                )
            if call.kind is NodeKind.TOOL and self.registry.get(call.tool) is None:
                raise OperationRefused(
                    ErrorCode.UNKNOWN_TOOL,
                    f"node {node.id!r} calls the tool {excerpt(call.tool)!r}, which this "
                    "daemon's registry does not hold",
                    details={"node": node.id, "tool": call.tool},
                )
            # An agent file's node is bound to its agent's hash from the run's flow files
            # (``flow_graph``); a graph read back from the store alone leaves it unbound.
            if call.kind is not NodeKind.AGENT or call.agent is None or call.agent in agents:
                continue
            try:
                agent = (known or {}).get(call.agent) or await self.load_agent(call.agent)
            except OperationRefused as exc:
                raise OperationRefused(
                    exc.code,
                    f"node {node.id!r}: {exc.message}",
                    details={**(exc.details or {}), "node": node.id, "agent": call.agent},
                ) from None
            if agent.kind is not AgentKind.BUILTIN:
                raise bad_request(
                    f"node {node.id!r} names a {agent.kind.value} agent; a graph's agent nodes "
                    "run built-in agents only (their loop runs inline in the graph run's log)",
                    details={"node": node.id, "agent": call.agent},
                )
            agents[call.agent] = agent
        return agents

    # -- flow files -----------------------------------------------------------

    def agent_parser(self) -> AgentParser:
        """How a flow's agent files are read: against this daemon's registry."""
        return registry_parser(self.registry.names(), self.registry.skills)

    async def keep_flow_files(self, files: FlowFiles) -> str:
        """Keep the bytes of ``files`` and its manifest content-addressed; the manifest's hash.

        Raises:
            StoreUnavailable: the database failed; a retry keeps what is missing.
        """
        manifest = files.bundle.manifest_bytes()
        digest = content_hash(manifest)
        contents = {**files.contents, digest: manifest}
        await self.access.read(self.access.store.flow_files.put, contents)
        return digest

    async def load_flow_files(self, manifest_hash: str) -> FlowFiles:
        """The files a flow run's head names, read back from the store.

        Raises:
            OperationRefused: unknown_graph when the store lacks the manifest or a member's bytes
                (it was kept before the head was written, so only a damaged store does).
        """
        read = self.access.store.flow_files.get
        manifest = await self.access.read(read, manifest_hash)
        if manifest is None:
            raise unknown_graph(manifest_hash)
        bundle = bundle_from_json(json.loads(manifest))
        wanted = {bundle.document} | {m.sha256 for m in bundle.members.values() if m.sha256}
        contents = {}
        for digest in sorted(wanted):
            data = await self.access.read(read, digest)
            if data is None:
                raise unknown_graph(digest)
            contents[digest] = data
        return FlowFiles(bundle, contents)

    async def load_flow_bundle(self, manifest_hash: str) -> FlowBundle:
        """The manifest a flow run's head names (without its members' bytes).

        Raises:
            OperationRefused: unknown_graph when the store lacks it.
        """
        manifest = await self.access.read(self.access.store.flow_files.get, manifest_hash)
        if manifest is None:
            raise unknown_graph(manifest_hash)
        return bundle_from_json(json.loads(manifest))

    async def checked_flow(self, files: FlowFiles) -> CheckedFlow:
        """The pre-check of ``files`` (``graphs.check_flow``), off the trio thread."""
        parse = self.agent_parser()
        return await trio.to_thread.run_sync(check_flow, files, parse, self.registry.file_inputs())

    async def flow_graph(self, manifest_hash: str) -> tuple[Graph, FlowFiles]:
        """A flow run's graph, bound to its agent files, from the files kept with it.

        Raises:
            OperationRefused: unknown_graph (``load_flow_files``), bad_request when the files
                no longer pass the pre-check here (a tool an agent file names is gone).
        """
        files = await self.load_flow_files(manifest_hash)
        checked = await self.checked_flow(files)
        if checked.graph is None:
            first = checked.errors[0]
            raise bad_request(
                f"the flow {files.bundle.canonical} no longer checks here: {first.message}",
                details={"errors": [error.to_json() for error in checked.errors]},
            )
        return checked.graph, files

    async def run_flow(self, run_id: str) -> str | None:
        """The manifest hash of the files kept with the graph run ``run_id`` (its head's
        ``flow``), or None for a run walked from its stored graph alone."""
        head = await self.access.read(self.access.store.read_log, run_id, 0, limit=1)
        event = head[0].event if head else None
        return event.flow if isinstance(event, GraphRunStarted) else None

    async def walked_graph(
        self, graph_hash: str, flow: str | None
    ) -> tuple[Graph, FlowFiles | None]:
        """The graph a graph run walks: its stored graph, or for a flow run (``flow``, its head's
        manifest) that graph bound to the agent files kept with the run, never re-read.

        Raises:
            OperationRefused: unknown_graph, or bad_request (``flow_graph``).
        """
        if flow is None:
            return await self.load_graph(graph_hash), None
        return await self.flow_graph(flow)

    async def graph_and_agents(
        self, graph_hash: str, flow: str | None = None
    ) -> tuple[Graph, list[AgentDefinition]] | None:
        """The graph a run walks (``walked_graph``) and its agents, or None when either does
        not load here."""
        try:
            graph, _ = await self.walked_graph(graph_hash, flow)
            return graph, list((await self.graph_agents(graph)).values())
        except OperationRefused:
            return None
