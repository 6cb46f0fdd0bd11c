"""Driving a built-in agent's run: the drive entry point every kind of agent goes through (a
process or service agent is handed to its own driver), and what a drive sets up for the loop:
the model gateway, the flow session, an unreachable model endpoint's refusal."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from salvor.protocol import (
    Envelope,
    FlowTool,
    RunFailed,
    RunState,
    RunView,
    Session,
)

from ..flows import (
    FlowHost,
    FlowSession,
    client_project,
    is_autonomous,
    session_of,
)
from ..mcp import (
    McpServerSpec,
    open_connections,
)
from ..models import ModelClients, ModelGateway
from ..processes import MARK_VAR, RUN_VAR, store_fingerprint
from ..proxies import probes_lane_write
from ..recording import Parked, RunContext
from ..tools import WRITE_TOOLS, ToolRegistry
from ._attachments import (
    attached_declares_probe,
    attachments_before,
    withdrawal_refusal,
    withdrawn_servers,
)
from ._credentials import Credentials, Undeclared
from ._definition import AgentDefinition, AgentKind
from ._drive_kit import DriveKit
from ._loop import AgentLoop
from ._process import drive_process, parked_write
from ._process_attachments import attached_lane_probe
from ._service import drive_service


def flow_session(
    agent: AgentDefinition,
    run_id: str,
    labels: dict[str, str] | None,
    host: FlowHost | None,
    *,
    graph_node: bool = False,
    branches: list[str] | None = None,
) -> FlowSession:
    """The flow session a conversation of ``agent`` in run ``run_id`` holds.

    In a child session ``finish`` is offered when the agent opted into it, declares outputs, or
    must choose a branch (``branches``: a graph node a branch node routes on): a child must be
    able to return its typed result.
    """
    session = session_of(labels, graph_node=graph_node)
    chosen = agent.flow_tools
    outputs = agent.outputs
    if (
        session is Session.CHILD
        and FlowTool.FINISH not in chosen
        and (outputs or branches is not None)
    ):
        chosen += (FlowTool.FINISH,)
    return FlowSession(
        run_id=run_id,
        session=session,
        autonomous=is_autonomous(labels),
        opted_in=chosen,
        outputs=outputs,
        branches=branches,
        host=host,
        client_project=client_project(labels),
    )


def reach_refusal(agent: AgentDefinition, credentials: Credentials | None) -> str | None:
    """Why the daemon may not drive ``agent`` with the operator's declarations as they are now
    (``Credentials.check_reach``: a definition stored before the flags changed is held to
    today's); None when it may, or outside the daemon (the command line trusts its files)."""
    if credentials is None or not credentials.strict:
        return None
    try:
        credentials.check_reach(agent)
    except Undeclared as exc:
        return f"the run's agent names what this daemon's operator has not declared: {exc}"
    return None


async def fail_unreachable(ctx: RunContext, refusal: str) -> RunView:
    """Fail the run of ``ctx`` with ``refusal`` (``reach_refusal``) instead of driving it.

    A run with nothing to drive is left as it is, one parked on a write that may have landed
    among them (a person settles it, and the next drive fails the run; its probe is not run,
    since that would dial what the refusal forbids). A sleeping run is woken when its timer
    is due, then failed; before then, left asleep.
    """
    if ctx.view.state is RunState.SLEEPING and not await ctx.wake_when_due():
        return ctx.view
    if ctx.view.idle:
        return ctx.view
    await ctx.record(RunFailed(error=refusal))
    return ctx.view


def gateway_for(
    agent: AgentDefinition,
    credentials: Credentials | None = None,
    clients: ModelClients | None = None,
) -> ModelGateway:
    """The model gateway a definition asks for, with the key bound to the endpoint it reaches.

    ``credentials``: the daemon's declarations; None resolves an agent file
    as the command line always has (from the process's environment).
    ``clients``: the daemon's HTTP clients kept between drives (None: one of its own).
    """
    endpoint = (credentials or Credentials()).endpoint_for(
        provider=agent.llm.provider,
        base_url=agent.llm.base_url,
        base_url_env=agent.llm.base_url_env,
        api_key_env=agent.llm.api_key_env,
    )
    return ModelGateway(
        endpoint,
        stream=agent.llm.stream,
        max_retries=agent.llm.max_retries,
        timeout_seconds=agent.llm.timeout_seconds,
        clients=clients,
    )


def probes_open_write(
    agent: AgentDefinition,
    registry: ToolRegistry,
    view: RunView,
    log: Sequence[Envelope] = (),
    attachable_mcp: Mapping[str, McpServerSpec] | None = None,
) -> bool:
    """Whether ``view`` is parked on an open write of ``agent`` that declares a probe: one of
    its definition's, or one attached to the run before the write (``log``: the run's log;
    ``attachable_mcp``: what an attached server reaches, ``attached_declares_probe``).

    Such a run is not only a person's to settle: a drive probes the write
    first (a process agent's, over the server's stand-in lane: ``McpLane``).
    A service agent's writes are never probed.
    """
    pending = parked_write(view)
    if pending is None:
        return False
    if declares_probe(agent, registry, pending.tool, pending.input):
        return True
    attached = attachments_before(view.labels, log, pending.seq)
    declared = attachable_mcp or {}
    return attached_declares_probe(
        agent, registry, declared, attached, pending.tool
    ) or attached_lane_probe(agent, declared, attached, pending.tool, pending.input, registry.get)


def declares_probe(
    agent: AgentDefinition, registry: ToolRegistry, tool_name: str, tool_input: Any = None
) -> bool:
    """Whether ``agent``'s write ``tool_name`` declares a probe this daemon can run.

    ``tool_input``: the write's recorded input; a process agent's MCP call is recorded as its
    server's lane (``mcp:<server>/tools/call``) with the tool's name in its input.
    """
    if agent.kind is AgentKind.PROCESS:
        return probes_lane_write(agent.mcp_servers, tool_name, tool_input)
    if agent.kind is not AgentKind.BUILTIN:
        return False
    if tool_name in agent.tools:
        tool = registry.get(tool_name)
        if tool is None:
            return tool_name in WRITE_TOOLS  # a file write: always probed (``file_change``)
        return registry.probe_of(tool) is not None
    return any(
        spec.probe_of(tool_name) is not None and spec.exposes(tool_name)
        for spec in agent.mcp_servers
    )


async def drive(
    kit: DriveKit,
    run_id: str,
    agent: AgentDefinition,
    *,
    on_record: Callable[[list[Envelope]], None] | None = None,
) -> RunView:
    """Drive a run to its next resting point and return its view there.

    ``kit``: what every drive is handed (the store, the registry, the clock, the credentials
    ``gateway_for`` reads, the flow host behind the flow tools a built-in agent opted into; the
    run's flow session comes from its labels: ``flow_session``).

    Raises:
        DriveInterrupted: the drive stopped with the run recoverable (a model
            call that may succeed later); the message says how to continue.
        ReplayDivergence: the log does not match what this definition does;
            nothing was recorded.

    Concurrency:
        The drive holds the run (``kit.access.driving``) from before it reads the log until it
        returns: a drive of a run another drive holds waits for that one to end, then goes on
        from the log it left.
    """
    async with kit.access.driving.hold(run_id):
        return await _drive_held(kit, run_id, agent, on_record)


async def _drive_held(
    kit: DriveKit,
    run_id: str,
    agent: AgentDefinition,
    on_record: Callable[[list[Envelope]], None] | None,
) -> RunView:
    access, clock, flows = kit.access, kit.clock, kit.flows
    refusal = reach_refusal(agent, kit.credentials)
    if refusal is not None:
        log = await access.read(access.store.read_log, run_id)
        ctx = RunContext(access, run_id, log, on_record=on_record, clock=clock)
        return await fail_unreachable(ctx, refusal)
    if agent.kind is AgentKind.PROCESS:
        # A local agent process: its model calls cross the loopback proxy
        # (one is started for this drive when the caller has none).
        return await drive_process(
            access,
            run_id,
            agent,
            proxy=kit.proxy,
            on_record=on_record,
            clock=clock,
            restarts=kit.process_restarts,
            flows=flows,
            workspace=kit.registry.workspace,
            skills=kit.registry.skills,
            attachable_mcp=kit.attachable_mcp,
        )
    if agent.kind is AgentKind.SERVICE:
        # A running service triggered over HTTP; its model calls reach this
        # run's session on the agent's own loopback port (held in ``ports``).
        return await drive_service(
            access,
            run_id,
            agent,
            proxy=kit.proxy,
            ports=kit.ports,
            on_record=on_record,
            clock=clock,
        )
    log = await access.read(access.store.read_log, run_id)
    ctx = RunContext(access, run_id, log, on_record=on_record, clock=clock)
    withdrawn = withdrawal_refusal(withdrawn_servers(ctx.view.labels, log, kit.attachable_mcp))
    if withdrawn is not None:
        return await fail_unreachable(ctx, withdrawn)
    if ctx.view.idle and not probes_open_write(
        agent, kit.registry, ctx.view, log, kit.attachable_mcp
    ):
        return ctx.view
    gateway = gateway_for(agent, kit.credentials, kit.model_clients)
    try:
        # MCP servers are started only when the run first needs one live.
        mark = {MARK_VAR: store_fingerprint(access.store.url), RUN_VAR: run_id}
        async with open_connections(agent.mcp_servers, mark=mark) as mcp:
            session = flow_session(agent, run_id, ctx.view.labels, flows)
            loop = AgentLoop(agent, kit.registry, gateway, mcp, session, mark, kit.attachable_mcp)
            await loop.run(ctx)
    except Parked:
        pass
    finally:
        await gateway.aclose()
    return ctx.view
