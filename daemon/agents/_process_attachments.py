"""What a process agent's ``salvor`` MCP server offers of the MCP servers attached to its run tree
at run time (``mcp:<server>``), and how a call of one reaches its server.

Listing: an attached server's tools are the built-in loop's one recorded read,
``mcp:<server>/tools/list`` (same name, same output), made as a drive starts, before the agent
process does, for a server the log holds no listing of; every later drive reads it from the log,
so a recovered or restarted run is offered what its first listing recorded whatever the server
lists today. A run with another call's intent open is not listed then (one open intent at a
time): the server is offered from the drive after. A server the agent's own ``attach_tool``
attaches is therefore offered from its next drive, as a program that lists its tools once would
see it anyway.

Calling: the ``salvor`` lane records the agent's call under the operator's declared effect and
key fields, and the server is reached by the daemon's own client (``McpConnections``) from the
operator's declaration as it is at this drive, its ``${VAR}`` headers expanded only as it
connects. No URL, command or header of it reaches the agent, its environment or the log. An open
write of one is probed by the lane with the declared probe (``attached_lane_probe`` tells
recovery to drive it), else the run waits for a person.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio
from salvor.protocol import (
    Effect,
    Envelope,
    EventKind,
    RunFailed,
    ToolCallCompleted,
    ToolCallRequested,
)

from ..mcp import (
    McpBuildError,
    McpConnections,
    McpError,
    McpServerSpec,
    attached_specs,
    exposed_tools,
    mcp_tool,
)
from ..proxies import SALVOR_SERVER, FlowServer
from ..recording import DriveInterrupted, RunContext
from ..tools import Tool
from ._agent_definition import AgentDefinition, AgentKind
from ._attachments import withdrawal_refusal


def listing_name(server: str) -> str:
    """The name a server's recorded listing carries in the log (the built-in loop's)."""
    return f"mcp:{server}/tools/list"


def recorded_listings(log: Sequence[Envelope]) -> dict[str, tuple[int, Any]]:
    """Each recorded listing call of ``log`` by tool name: its intent's seq and its output
    (None while its intent is open)."""
    found: dict[str, tuple[int, Any]] = {}
    by_seq: dict[int, str] = {}
    for envelope in log:
        event = envelope.event
        if event.KIND is EventKind.TOOL_CALL_REQUESTED and event.tool.endswith("/tools/list"):
            found.setdefault(event.tool, (envelope.seq, None))
            by_seq[envelope.seq] = event.tool
        elif event.KIND is EventKind.TOOL_CALL_COMPLETED and event.seq in by_seq:
            tool = by_seq[event.seq]
            if found[tool][0] == event.seq:
                found[tool] = (event.seq, event.output)
    return found


async def offer_attached_servers(
    ctx: RunContext,
    agent: AgentDefinition,
    log: Sequence[Envelope],
    attachable: Mapping[str, McpServerSpec],
    connections: McpConnections,
    salvor: FlowServer | None,
) -> bool:
    """Offer ``salvor`` (the run's ``salvor`` server) the tools of each server attached to the
    run's tree (its ``session.attached``) that ``attachable`` (the operator's file today)
    declares, listing through the log each not listed yet.

    Returns False when the run is not to be driven: it holds a server the operator withdrew
    (failed in one sentence, as a built-in agent's run is; one parked for a person is left
    so), its recorded listing is not a list, or its tools no longer build (``RunFailed``
    recorded).

    Raises:
        DriveInterrupted: a server could not list its tools; the listing's intent stays open
            and the next drive lists it again (a read).
    """
    if salvor is None:
        return True
    servers, withdrawn = attached_specs(salvor.session.attached, attachable)
    if withdrawn:
        if not ctx.view.idle:
            await _fail(ctx, withdrawal_refusal(withdrawn))
        return False
    own = {spec.name for spec in agent.mcp_servers} | {SALVOR_SERVER}
    listings = recorded_listings(log)
    for spec in servers:
        if spec.name in own:
            continue
        listed = await _listing(ctx, spec, listings.get(listing_name(spec.name)), connections)
        if listed is None:
            continue
        if not (isinstance(listed, dict) and isinstance(listed.get("tools"), list)):
            return await _fail(
                ctx, f"the recorded tool listing of MCP server {spec.name!r} is not a list"
            )
        try:
            exposed = exposed_tools((spec,), {spec.name: listed["tools"]}, {})
        except McpBuildError as exc:
            return await _fail(ctx, f"the attached MCP server's tools no longer build: {exc}")
        connections.admit(spec)
        for _, entry in exposed:
            tool, shown = mcp_tool(spec, entry, connections)
            read = None if tool.probe is None else _raw_read(spec, tool.probe.tool, connections)
            salvor.offer(tool, shown["input_schema"], read)
    return True


async def _listing(
    ctx: RunContext,
    spec: McpServerSpec,
    recorded: tuple[int, Any] | None,
    connections: McpConnections,
) -> Any:
    """The server's recorded listing: the log's, or made now (None: not now, another call's
    intent is open)."""
    if recorded is not None and recorded[1] is not None:
        return recorded[1]
    pending = ctx.view.pending
    if recorded is not None and pending is not None and pending.seq == recorded[0]:
        seq = recorded[0]  # its own intent, left open by a drive that stopped: listed again
    elif pending is not None:
        return None
    else:
        seq = ctx.view.next_seq + ctx.held
        await ctx.record(
            ToolCallRequested(
                tool=listing_name(spec.name),
                input={},
                effect=Effect.READ.value,
                idempotency_key=None,
            )
        )
    ctx.access.driving.gate(ctx.run_id)
    connections.admit(spec)
    try:
        output = {"tools": await connections.list_tools(spec.name)}
    except McpError as exc:
        raise DriveInterrupted(
            f"{exc.message}, so the tools of the attached MCP server {spec.name!r} could not be "
            f"listed; `salvor resume {ctx.run_id}` tries again"
        ) from None
    with trio.CancelScope(shield=True):
        await ctx.record(ToolCallCompleted(seq=seq, output=output))
    return output


def _raw_read(spec: McpServerSpec, name: str, connections: McpConnections):
    """The probe ``name`` of ``spec``'s server as the lane sends it: the server's raw result
    (the lane reads the answer out of it, and says how it failed)."""

    async def read(arguments: Any) -> Any:
        return await connections.call_tool(spec.name, name, arguments, None)

    return read


async def _fail(ctx: RunContext, error: str) -> bool:
    await ctx.record(RunFailed(error=error))
    return False


def attached_lane_probe(
    agent: AgentDefinition,
    declared: Mapping[str, McpServerSpec],
    names: Sequence[str],
    tool_name: str,
    tool_input: Any,
    registry_tool: Callable[[str], Tool | None] | None = None,
) -> bool:
    """Whether a process ``agent``'s open write, recorded on its ``salvor`` lane as
    ``tool_name`` with ``tool_input``, is among ``names`` (those attached before the write) and
    has a probe the relay reads: a registry tool's (``registry_tool``: the registry's tool of a
    name, holding its probe's read), or an attached server's declared in ``declared``."""
    if agent.kind is not AgentKind.PROCESS or tool_name != f"mcp:{SALVOR_SERVER}/tools/call":
        return False
    called = tool_input.get("name") if isinstance(tool_input, dict) else None
    if isinstance(called, str) and called in names and registry_tool is not None:
        tool = registry_tool(called)
        if tool is not None and tool.probe is not None:
            return registry_tool(tool.probe.tool) is not None
    own = {spec.name for spec in agent.mcp_servers}
    servers, _ = attached_specs(names, declared)
    return isinstance(called, str) and any(
        spec.name not in own and spec.exposes(called) and spec.probe_of(called) is not None
        for spec in servers
    )


def lane_called(pending: Mapping[str, Any]) -> str:
    """The tool an open intent (a run summary's ``pending``) calls: a call on a process
    agent's ``salvor`` lane names it in its input; any other is its own tool."""
    tool, given = pending.get("tool"), pending.get("input")
    if tool == f"mcp:{SALVOR_SERVER}/tools/call" and isinstance(given, dict):
        return str(given.get("name"))
    return tool
