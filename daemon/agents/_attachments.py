"""What a built-in agent's conversation is offered of the tools attached to its run tree at run
time: registry tools by name, and the operator's attachable MCP servers (``mcp:<name>``).

An attached server is listed as the agent's own servers are: one recorded ``read``
(``mcp:<server>/tools/list``), made just before the first model call that offers its tools, so
a replay, a recovered or restarted run and a fork offer the tools its recorded calls offered
whatever the server lists today. Its tools carry the effects, keys and probes the operator's
file declares, so an open write of one is probed as a definition's server's is.

A name something else offers already is not offered again; an attached server named as one of
the agent's own servers is the agent's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from salvor.protocol import (
    FlowTool,
    RunFailed,
    RunState,
    attached_tools,
)

from ..flows import tree_tools
from ..mcp import (
    McpBuildError,
    McpConnections,
    McpServerSpec,
    attached_specs,
    exposed_tools,
    listing_tool,
    mcp_tool,
    probe_reader,
)
from ..recording import RunContext
from ..tools import Tool, ToolRegistry
from ._agent_definition import AgentDefinition, AgentKind

# The loop's own tools, never offered by an attachment.
_OWN = {"submit_output", *(tool.value for tool in FlowTool)}


class AttachingLoop(Protocol):
    """What ``take_attachments`` uses of a built-in agent's conversation: an ``AgentLoop``
    (which calls it, so it names only what it uses, and the two modules import one way)."""

    agent: AgentDefinition
    registry: ToolRegistry
    # The conversation's MCP connections (None: a bare loop reaches no server).
    mcp: McpConnections | None
    attachable_mcp: Mapping[str, McpServerSpec]
    # The attachments known, those its own attach_tool calls made, and the servers listed.
    attached: tuple[str, ...]
    self_attached: list[str]
    attached_servers: set[str]
    # The tools offered: the flow tools, the rest by name (each write's probe), the specs the
    # model is sent, and which are an MCP server's.
    flow_tools: dict[str, Tool]
    tools: dict[str, Tool]
    probes: dict[str, Tool]
    tool_specs: list[dict]
    mcp_names: set[str]


def attachments_of(labels: Mapping[str, str] | None, events: Iterable) -> tuple[str, ...]:
    """The attachments a run holds: those its head inherited, then its log's ``ToolsAttached``
    among ``events``."""
    return tree_tools(labels, attached_tools(events))


def withdrawn_servers(
    labels: Mapping[str, str] | None, log: Sequence, declared: Mapping[str, McpServerSpec]
) -> list[str]:
    """The MCP servers attached to the run (its head's, its log's) that ``declared`` (the
    operator's file today) no longer has."""
    names = attachments_of(labels, (envelope.event for envelope in log))
    return attached_specs(names, declared)[1]


def withdrawal_refusal(servers: Sequence[str]) -> str | None:
    """Why a run attached to ``servers`` the operator withdrew is not driven (None: none)."""
    if not servers:
        return None
    return (
        f"the MCP server {servers[0]!r} attached to this run is no longer among the operator's "
        "attachable servers (salvor serve --attachable-mcp), so its tools cannot be reached; "
        "declare it there again and resume, or fork the run from before it was attached"
    )


async def take_attachments(loop: AttachingLoop, ctx: RunContext) -> bool:
    """Offer ``loop`` the tools attached to its run's tree so far: those its head inherited,
    the ``ToolsAttached`` the replay cursor has passed (in replay: those recorded before this
    point of the log, so a replay offers what the recorded call offered), and the
    conversation's own ``attach_tool`` answers.

    Returns:
        Whether they changed since the last call (the caller's children inherit them anew).

    Raises:
        Parked: (FAILED) an attached server's recorded listing is not a list of tools, or its
            tools no longer build (``RunFailed`` is recorded).
    """
    ctx.live  # noqa: B018 (the cursor passes the attachments standing before the next call)
    names = tree_tools(ctx.view.labels, [*ctx.cursor.attached, *loop.self_attached])
    if names == loop.attached:
        return False
    loop.attached = names
    taken = {*_OWN, *loop.flow_tools}
    for name in names:
        tool = loop.registry.get(name)
        if tool is None or name in loop.tools or name in taken:
            continue
        loop.tools[name] = tool
        if tool.probe:
            loop.probes[name] = loop.registry.probe_of(tool)
        loop.tool_specs.append(tool.spec())
    servers, _ = attached_specs(names, loop.attachable_mcp)
    own = {spec.name for spec in loop.agent.mcp_servers}
    for spec in servers:
        if spec.name not in own and spec.name not in loop.attached_servers:
            await _offer_server(loop, ctx, spec, taken)
    return True


async def _offer_server(
    loop: AttachingLoop, ctx: RunContext, spec: McpServerSpec, taken: set[str]
) -> None:
    """List an attached server through the log and offer its exposed tools not offered yet."""
    loop.attached_servers.add(spec.name)
    if loop.mcp is None:
        return  # a conversation with no connections (a bare loop) reaches no server
    loop.mcp.admit(spec)
    listed = await ctx.tool_call(listing_tool(spec, loop.mcp), {})
    if not (isinstance(listed, dict) and isinstance(listed.get("tools"), list)):
        await _fail(ctx, f"the recorded tool listing of MCP server {spec.name!r} is not a list")
    try:
        exposed = exposed_tools((spec,), {spec.name: listed["tools"]}, {})
    except McpBuildError as exc:
        await _fail(ctx, f"the attached MCP server's tools no longer build: {exc}")
    for _, entry in exposed:
        if entry["name"] in loop.tools or entry["name"] in taken:
            continue
        tool, model_spec = mcp_tool(spec, entry, loop.mcp)
        loop.tools[tool.name] = tool
        if tool.probe is not None:
            loop.probes[tool.name] = probe_reader(spec, tool.probe.tool, loop.mcp)
        loop.mcp_names.add(tool.name)
        loop.tool_specs.append(model_spec)


async def _fail(ctx: RunContext, error: str) -> None:
    await ctx.control(RunFailed(error=error))
    await ctx.park(RunState.FAILED)


def attachments_before(labels: Mapping[str, str] | None, log: Sequence, seq: int) -> tuple:
    """The attachments a run held when its event ``seq`` was recorded (an open write's
    intent: what its call was offered)."""
    return attachments_of(labels, (envelope.event for envelope in log if envelope.seq < seq))


def attached_declares_probe(
    agent: AgentDefinition,
    registry: ToolRegistry,
    declared: Mapping[str, McpServerSpec],
    names: Sequence[str],
    tool_name: str,
) -> bool:
    """Whether the write ``tool_name`` a built-in ``agent`` was offered by the attachments
    ``names`` declares a probe this daemon can run: an attached registry tool's, or an attached
    server's declared in ``declared`` (the operator's file), as ``take_attachments`` offers
    them."""
    if agent.kind is not AgentKind.BUILTIN:
        return False
    if tool_name in names:
        tool = registry.get(tool_name)
        return tool is not None and registry.probe_of(tool) is not None
    own = {spec.name for spec in agent.mcp_servers}
    servers, _ = attached_specs(names, declared)
    return any(
        spec.name not in own and spec.exposes(tool_name) and spec.probe_of(tool_name) is not None
        for spec in servers
    )
