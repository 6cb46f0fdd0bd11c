"""Tools attached to a run tree at run time: the operator's ``POST /v1/runs/{id}/tools`` and an
agent's ``attach_tool``.

Registry tools and the operator's attachable MCP servers (``--attachable-mcp``) are attached, by
name only: what a registry tool does is the daemon's own code, and where a server is, what it
spawns and which secret it is sent are the operator's file's, so neither an HTTP caller nor an
agent ever chooses where the daemon connects or which secret it sends. A server is recorded as
``mcp:<name>`` among the tools (``salvor.daemon.mcp``'s attachment names).

The operator's attachment is a ``ToolsAttached`` in the log of the run named and of each of its
children that has not ended, recorded while the run rests (a drive of it holds it: the attach
waits for that drive, a bounded while). A built-in agent offers the tools from its next model
call (a replay passes the event where it stands, so a recovered or forked run offers what its
recorded calls offered); a process agent's ``salvor`` server lists them from its next drive. A
child started after it inherits them in its head (``salvor.tools``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import trio
from salvor.protocol import (
    MAX_LABEL_VALUE_BYTES,
    TERMINAL_STATES,
    Actor,
    ErrorCode,
    RunState,
    ToolsAttached,
    attached_tools,
)

from ..flows import MAP_OF_LABEL, PARENT_LABEL, tree_tools
from ..mcp import McpServerSpec, attached_server, is_server_attachment, server_attachment
from ..recording import StoreAccess
from ..tools import ToolFailed, ToolRegistry
from ..web import OperationRefused, bad_request, wrong_state
from ._run_reads import RunReads

# How long an attach waits for a drive holding the run to let go of it.
HOLD_WAIT_SECONDS = 5.0


def unknown_tools(registry: ToolRegistry, names: Sequence[str]) -> list[str]:
    """The registry tool names among ``names`` the registry lacks (server attachments aside)."""
    return [name for name in names if not is_server_attachment(name) and registry.get(name) is None]


def unknown_servers(declared: Mapping[str, McpServerSpec], names: Sequence[str]) -> list[str]:
    """The MCP servers attached among ``names`` the operator's file does not declare."""
    servers = (attached_server(name) for name in names)
    return [server for server in servers if server is not None and server not in declared]


def _unknown_server(declared: Mapping[str, McpServerSpec], server: str) -> str:
    return (
        f"this daemon's operator declares no attachable MCP server {server!r} "
        f"(--attachable-mcp declares: {', '.join(declared) or 'none'})"
    )


def _fits(labels: dict | None, attached: Sequence[str], names: Sequence[str]) -> bool:
    """Whether the tree's tools still fit the label a child inherits them in."""
    joined = ",".join(tree_tools(labels, [*attached, *names]))
    return len(joined.encode()) <= MAX_LABEL_VALUE_BYTES


class RunTools:
    """The operator's attachments over one store and one registry."""

    def __init__(
        self,
        access: StoreAccess,
        reads: RunReads,
        registry: ToolRegistry,
        attachable_mcp: Mapping[str, McpServerSpec] | None = None,
    ) -> None:
        self.access = access
        self.reads = reads
        self.registry = registry
        self.attachable_mcp = attachable_mcp or {}

    async def attach(self, run_id: str, names: Sequence[str], servers: Sequence[str] = ()) -> dict:
        """Attach the registry tools ``names`` and the operator's attachable MCP servers
        ``servers`` to ``run_id`` and its children that have not ended; ``{run_id, tools, runs,
        busy}``: the run's attachments now (a server as ``mcp:<name>``), the runs of the tree
        that hold the attachment now (recorded now, or before), and children a drive held past
        the wait (they did not record it).

        Raises:
            OperationRefused: unknown_run; unknown_tool (a name the registry lacks);
                unknown_mcp_server (a server ``--attachable-mcp`` does not declare);
                bad_request (the tree's tools would not fit the label children inherit them
                in); client_driven_run; wrong_state (the run has ended, or a drive holds it
                past the wait). Nothing is recorded on any of them.
        """
        names = list(dict.fromkeys([*names, *map(server_attachment, servers)]))
        view = await self.reads.view(run_id)
        missing = unknown_tools(self.registry, names)
        if missing:
            raise OperationRefused(
                ErrorCode.UNKNOWN_TOOL,
                f"this daemon's tool registry has no tool {missing[0]!r} to attach "
                f"(it has: {', '.join(self.registry.names()) or 'none'})",
            )
        undeclared = unknown_servers(self.attachable_mcp, names)
        if undeclared:
            raise OperationRefused(
                ErrorCode.UNKNOWN_MCP_SERVER, _unknown_server(self.attachable_mcp, undeclared[0])
            )
        if view.driven_by == Actor.CLIENT:
            raise OperationRefused(
                ErrorCode.CLIENT_DRIVEN_RUN,
                f"run {run_id} is client-driven: its client offers its tools, not this daemon",
            )
        if view.terminal:
            raise wrong_state(f"run {run_id} is {view.state.value}; nothing is left to attach to")
        if not _fits(view.labels, await self._attached(run_id), names):
            raise bad_request(
                f"the run tree's attached tools would pass the {MAX_LABEL_VALUE_BYTES} bytes "
                "its children inherit them in"
            )
        if not await self._record(run_id, names):
            raise wrong_state(f"run {run_id} has ended; nothing is left to attach to")
        runs, busy = [run_id], []
        for child in await self._open_children(run_id):
            try:
                recorded = await self._record(child, names)
            except OperationRefused:
                busy.append(child)
                continue
            if recorded:
                runs.append(child)
        return {
            "run_id": run_id,
            "tools": list(tree_tools(view.labels, await self._attached(run_id))),
            "runs": runs,
            "busy": busy,
        }

    async def _attached(self, run_id: str) -> tuple[str, ...]:
        """What the run's own log attached so far."""
        return attached_tools(envelope.event for envelope in await self.reads.read_log(run_id))

    async def _record(self, run_id: str, names: Sequence[str]) -> bool:
        """Record the attachment in ``run_id``'s log while no drive holds it (the names it lacks
        only); False when the run ended meanwhile.

        Raises:
            OperationRefused: wrong_state, a drive held the run past the wait.
        """
        with trio.move_on_after(HOLD_WAIT_SECONDS) as waiting:
            async with self.access.driving.hold(run_id):
                view = await self.reads.view(run_id)
                if view.state in TERMINAL_STATES or view.state is RunState.NOT_STARTED:
                    return False
                # A name the run has already (inherited, or attached before) is not recorded
                # again: attaching twice leaves the log as once did.
                have = tree_tools(view.labels, await self._attached(run_id))
                fresh = [name for name in names if name not in have]
                if fresh:
                    await self.access.append(
                        run_id, [ToolsAttached(tools=fresh, by="operator")], view
                    )
                return True
        assert waiting.cancelled_caught
        raise wrong_state(
            f"run {run_id} is being driven and did not rest within {HOLD_WAIT_SECONDS:g}s; "
            "attach again once it rests"
        )

    async def _open_children(self, run_id: str) -> list[str]:
        """The subagent children and map items under ``run_id`` that have not ended, depth
        first."""
        found: list[str] = []
        for label in (PARENT_LABEL, MAP_OF_LABEL):
            children, _ = await self.reads.list_runs(label=(label, run_id))
            for child in children:
                if child.state is not None and RunState(child.state) in TERMINAL_STATES:
                    continue
                found.append(child.run_id)
                found.extend(await self._open_children(child.run_id))
        return found


def agent_attach(
    registry: ToolRegistry,
    declared: Mapping[str, McpServerSpec],
    allowed: frozenset[str],
    names: Sequence[str],
) -> dict:
    """An agent's ``attach_tool``: ``{attached}`` when every name is on the operator's
    allow-list (``--attachable-tools``; a server written ``mcp:<name>`` there) and in the
    registry, or names a server ``--attachable-mcp`` declares.

    Raises:
        ToolFailed: (retryable=False) a name outside the allow-list, the registry or the
            declared servers; nothing is attached.
    """
    outside = [name for name in names if name not in allowed]
    if outside:
        offered = ", ".join(sorted(allowed)) or "none (the operator allows no attachment)"
        raise ToolFailed(
            f"the operator does not allow agents to attach {outside[0]!r}; attachable: {offered}",
            retryable=False,
        )
    missing = unknown_tools(registry, names)
    if missing:
        raise ToolFailed(f"the tool registry has no tool {missing[0]!r}", retryable=False)
    undeclared = unknown_servers(declared, names)
    if undeclared:
        raise ToolFailed(_unknown_server(declared, undeclared[0]), retryable=False)
    return {"attached": list(names)}
