"""The ``salvor`` MCP server a process agent reaches: the flow tools, answered in this process.

A process run is offered it beside its declared servers, through the same stand-in variables
(``SALVOR_MCP_URL_SALVOR``, ``SALVOR_MCP_SERVER_SALVOR``) and the same kind of lane
(``_mcp_lane``): every request is recorded, replayed and parked as any server's is. Only the
live half differs: where a lane would start or dial a server, it asks a ``FlowServer``, which
answers ``initialize``, ``ping``, ``tools/list`` and ``tools/call`` as an MCP server would, from
``salvor.daemon.flows.flow_tools`` bound to the run's flow session.

What the tools do over MCP:

* ``ask_user`` answers with a ``_meta.salvor`` suspend (the question as its ``reason``, the
  answer's schema as its ``input_schema``), so the lane parks the run exactly as it does for
  any server asking that: the process is stopped, and once a person resumes the run it is
  started again and the call is answered with the resume input, ``{"answer": ...}``, as a text
  block holding its JSON and as ``structuredContent``.
* ``finish`` answers with the checked result (text and ``structuredContent``); the lane notes a
  good one on the proxy session, and from then on refuses every ``tools/call`` of the run on any
  lane; the run's output is that result.
* ``subagent`` asks the host for the child's result; a child resting short raises
  ``NotPerformed`` through the lane, which stops the process with the call's intent open.
* A refusal (a bad question, a bad finish, an unknown tool, an argument its schema rejects) is an
  MCP tool error: a result flagged ``isError`` whose text the agent's model reads.

The agent's skills are advertised in the ``initialize`` answer's ``instructions`` (after what the
server says of itself), which the lane records like any answer; the agent reads them with the
``read`` its skills grant, listed among the file tools.

The file tools the agent declares are listed after the flow tools; a ``write`` or ``edit`` is
made from the plan its lane recorded with the call's intent, and probed by it after a crash
(``_salvor_writes``).

Registry tools attached to the run's tree at run time (``ToolsAttached``, the head's
``salvor.tools``, the run's own ``attach_tool`` answers) are listed after the flow tools and
called through the same lane: recorded, replayed and parked as every call of it is. A keyed
one claims the identity a built-in agent's call of it claims (``key_fields``), so one key is
performed once across runs of either kind; an open write of one is settled by the tool's probe,
read from the registry (``probe``), else parks the run for a person. The tools of an attached MCP
server (``offer``, from ``agents._process_attachments``) follow them, each call relayed to that
server by the daemon's own client under the effect, keys and probe the operator declared, so an
open write of one is probed by the lane as a declared server's is.

A process agent sees every flow tool its session's row offers (the server is its opt-in;
``salvor_mcp = false`` turns it off), and ``finish`` in either session: it is how a process agent
hands back a typed result, a top-level one included.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from salvor import __version__
from salvor.protocol import (
    DeclaredOutput,
    Effect,
    Envelope,
    FlowTool,
    SchemaViolation,
    Session,
    is_finish_result,
    validate,
)

from ..files import PLAN_FIELD, FileTools, plan_input
from ..flows import FlowHost, FlowSession, flow_tool, flow_tools, is_autonomous, session_of
from ..mcp import McpRemoteError, McpServerSpec, McpSession
from ..skills import Skill, with_skills
from ..tools import WRITE_TOOLS, Suspend, Tool, ToolCall, ToolFailed
from ._mcp_replay import LaneCall, lane_calls, stub_result

SALVOR_SERVER = "salvor"
METHOD_NOT_FOUND = -32601
# The MCP revisions this server speaks; an agent asking for another is answered with the newest.
PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")


def tool_error_result(message: str) -> dict:
    """An MCP tool error: the agent's model reads ``message``; nothing parks or fails the run."""
    return {"content": [{"type": "text", "text": message}], "isError": True}


def finish_of(call: LaneCall) -> dict | None:
    """The result of ``call`` when it is a good ``finish`` on the ``salvor`` lane; else None."""
    if call.method != "tools/call" or not isinstance(call.input, dict):
        return None
    if call.input.get("name") != FlowTool.FINISH.value or not isinstance(call.output, dict):
        return None
    result = call.output.get("result")
    if not isinstance(result, dict) or result.get("isError") is True:
        return None
    checked = result.get("structuredContent")
    return checked if is_finish_result(checked) else None


def self_attached(log: Sequence[Envelope]) -> list[str]:
    """The tools a process run's own ``attach_tool`` calls attached, as the ``salvor`` lane
    recorded their answers."""
    names: list[str] = []
    for call in lane_calls(log, SALVOR_SERVER):
        if call.method != "tools/call" or not isinstance(call.input, dict):
            continue
        if call.input.get("name") != FlowTool.ATTACH_TOOL.value:
            continue
        result = call.output.get("result") if isinstance(call.output, dict) else None
        if not isinstance(result, dict) or result.get("isError") is True:
            continue
        found = (result.get("structuredContent") or {}).get("attached")
        if isinstance(found, list):
            names.extend(name for name in found if isinstance(name, str))
    return names


class FlowServer:
    """The live half of the ``salvor`` lane: one run's flow tools as an MCP server answers them.

    It has what a lane reads of a live ``McpSession`` (``initialized``, ``broken``,
    ``remote_session_id``, the notification and request hooks, ``notify``, ``cancel``,
    ``pass_through``, ``aclose``) and answers every request in this process.
    """

    remote_session_id: str | None = None
    broken: str | None = None

    def __init__(
        self,
        session: FlowSession,
        files: FileTools | None = None,
        *,
        resolve: Callable[[str], Tool | None] | None = None,
        skills: Sequence[Skill] = (),
    ) -> None:
        self.session = session
        # The agent's skills, advertised in the instructions ``initialize`` answers with.
        self.skills = tuple(skills)
        # The file tools the agent declares, offered after the flow tools.
        self.files: dict[str, Tool] = dict(files.tools) if files is not None else {}
        self._planner = files.planner if files is not None else None
        # The read that tells whether a planned write or edit landed (``_salvor_writes``).
        self.prober: Tool | None = files.prober if files is not None else None
        # The registry behind attached names (the host's), and the tools attached so far.
        self._resolve = resolve
        self.attached: dict[str, Tool] = {}
        # An attached server's tools: the input schemas it listed, and the raw reads of its
        # probes (read for the lane's own probe alone, ``probe``).
        self.schemas: dict[str, dict] = {}
        self.probe_reads: dict[str, Callable[[Any], Awaitable[Any]]] = {}
        # An attached registry write's probes: the registry's reads, by name (``probe``).
        self.probe_tools: dict[str, Tool] = {}
        self.spec = McpServerSpec(
            name=SALVOR_SERVER,
            effects={
                **{name.value: flow_tool(session, name).effect.value for name in FlowTool},
                **{name: tool.effect.value for name, tool in self.files.items()},
            },
        )
        self.initialized: dict | None = None
        # A lane sets these on any session; this server sends nothing unasked.
        self.on_notification = None
        self.on_request = None
        self.attach(session.attached)

    def attach(self, names: Sequence[str]) -> None:
        """Offer the registry tools ``names`` from the next ``tools/list`` on (a flow tool's
        name, a file tool's, or one the registry lacks, is not offered), each with its key
        fields (``key_fields``: a keyed write's relayed call claims the identity a built-in
        agent's call of it claims) and its probe, when the registry holds the probe's read."""
        taken = {tool.value for tool in FlowTool} | set(self.files)
        for name in names:
            tool = None if self._resolve is None else self._resolve(name)
            if tool is None or name in taken or name in self.attached:
                continue
            self.attached[name] = tool
            self.spec.effects[name] = tool.effect.value
            if tool.idempotency_keys:
                self.spec.idempotency_keys[name] = tool.idempotency_keys
            prober = None if tool.probe is None else self._resolve(tool.probe.tool)
            if prober is not None:
                self.spec.probes[name] = tool.probe
                self.probe_tools[tool.probe.tool] = prober
        # A child the run starts from now on inherits them.
        tree = tuple(dict.fromkeys([*self.session.attached, *names]))
        self.session = replace(self.session, attached=tree)

    def offer(
        self, tool: Tool, schema: dict, probe_read: Callable[[Any], Awaitable[Any]] | None
    ) -> None:
        """Offer an attached MCP server's ``tool`` (listed with ``schema``) from the next
        ``tools/list`` on, with its declared key fields and probe (``probe_read``: the raw read
        of its probe tool); a name something else offers already is not offered."""
        if tool.name in {tool.value for tool in FlowTool} | set(self.files) | set(self.attached):
            return
        self.attached[tool.name] = tool
        self.schemas[tool.name] = schema
        self.spec.effects[tool.name] = tool.effect.value
        if tool.idempotency_keys:
            self.spec.idempotency_keys[tool.name] = tool.idempotency_keys
        if tool.probe is not None and probe_read is not None:
            self.spec.probes[tool.name] = tool.probe
            self.probe_reads[tool.probe.tool] = probe_read

    async def probe(self, name: str, arguments: Any, attempt: ToolCall) -> Any:
        """The raw result of the probe ``name`` with ``arguments``, for the lane's own probe of
        an open write (``probe_request``): an attached server's, or an attached registry
        write's read (its answer as the relay gives a performed call's, ``stub_result``). No
        request of the agent reaches this: it is answered only with the tools it was offered.

        Raises:
            McpRemoteError: no attached write is probed by ``name`` (nothing read).
            McpError: as the server's call does.
            ToolFailed: as the registry's read does.
        """
        prober = self.probe_tools.get(name)
        if prober is not None:
            return stub_result(await prober.handler(arguments, attempt))
        read = self.probe_reads.get(name)
        if read is None:
            raise McpRemoteError(SALVOR_SERVER, f"relays no probe {name!r}", code=METHOD_NOT_FOUND)
        return await read(arguments)

    def opened(self, initialize: dict | None) -> FlowServer:
        """This server, initialised with the agent's ``initialize`` (or the recorded one)."""
        asked = (initialize or {}).get("protocolVersion")
        self.initialized = {
            "protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0],
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": SALVOR_SERVER, "version": __version__},
            "instructions": with_skills(
                "salvor's flow tools: ask the person running this a question, hand a task to "
                "another agent, and finish with your result",
                self.skills,
            ),
        }
        return self

    def effect_of(self, tool: Any) -> Effect:
        """A flow, file or attached tool's effect; a name salvor does not offer is refused
        unperformed (a read)."""
        if isinstance(tool, str) and tool in self.files:
            return self.files[tool].effect
        if isinstance(tool, str) and tool in self.attached:
            return self.attached[tool].effect
        try:
            return flow_tool(self.session, FlowTool(tool)).effect
        except ValueError:
            return Effect.READ

    def pass_through(self, headers: Mapping[str, str]) -> None:
        return None

    async def notify(self, method: str, params: dict | None = None) -> None:
        return None

    async def cancel(self, key: Any, reason: str | None) -> bool:
        # A flow tool is not cut by the agent's cancellation: what it recorded stays recorded.
        return False

    async def aclose(self) -> None:
        return None

    async def offered(self) -> list[Tool]:
        """The tools the run sees now: its session's row, and ``finish`` (``FlowTool`` order)."""
        tools = flow_tools(self.session, edit_mode=await self._edit_mode())
        if not any(tool.name == FlowTool.FINISH for tool in tools):
            tools.append(flow_tool(self.session, FlowTool.FINISH))
        order = list(FlowTool)
        flows = sorted(tools, key=lambda tool: order.index(FlowTool(tool.name)))
        return flows + list(self.files.values()) + list(self.attached.values())

    async def _edit_mode(self) -> bool:
        host = self.session.host
        if host is None or self.session.session is not Session.MAIN:
            return False
        try:
            return await host.edit_mode()
        except ToolFailed:
            return False  # a setting that cannot be read keeps authoring off

    async def request(self, method: str, params: dict, *, call: ToolCall) -> dict:
        """The result of one request (``call``: the lane's recorded call it belongs to).

        Raises:
            McpRemoteError: a method this server does not answer (settled: asking again is the
                same).
            ToolFailed: a retryable failure of a tool (the lane tries again as its effect allows).
            NotPerformed: the tool could not be performed now (a subagent's child rests short).
        """
        if method == "initialize":
            return self.opened(params).initialized
        if method == "ping":
            return {}
        if method == "tools/list":
            return {
                "tools": [
                    {
                        "name": tool.name,
                        "description": tool.description,
                        "inputSchema": self.schemas.get(tool.name, tool.input_schema),
                    }
                    for tool in await self.offered()
                ]
            }
        if method == "tools/call":
            return await self._call(params, call)
        message = f"salvor's MCP server does not answer {method}"
        raise McpRemoteError(
            SALVOR_SERVER,
            f"does not answer {method}",
            code=METHOD_NOT_FOUND,
            error={"code": METHOD_NOT_FOUND, "message": message},
        )

    def planner_of(self, name: Any, arguments: Any) -> Tool | None:
        """The read that plans the call of ``name`` with ``arguments`` when it is a write or an
        edit of the agent's file tools its schema takes; else None (nothing to plan)."""
        tool = self.files.get(name) if isinstance(name, str) else None
        if tool is None or tool.name not in WRITE_TOOLS:
            return None
        try:
            validate(tool.input_schema, arguments, what=f"the {name} call")
        except SchemaViolation:
            return None  # refused by ``_call``, with nothing planned
        return self._planner

    async def _perform(self, tool: Tool, arguments: Any, call: ToolCall, plan: Any) -> Any:
        """A tool's outcome. A file write or edit is made from ``plan``, the one its lane
        recorded with the call's intent (``_salvor_writes``); asked without one (not through a
        lane) it is planned here."""
        if tool.name in WRITE_TOOLS and self.files.get(tool.name) is tool:
            if not isinstance(plan, dict):
                plan = await self._planner.handler(plan_input(tool.name, arguments), call)
            return await tool.handler({**arguments, PLAN_FIELD: plan}, call)
        return await tool.handler(arguments, call)

    async def _call(self, params: dict, call: ToolCall) -> dict:
        name, arguments = params.get("name"), params.get("arguments", {})
        tools = {tool.name: tool for tool in await self.offered()}
        tool = tools.get(name)
        if tool is None:
            # Refused by what the run was offered: an attached server's probe that is not among
            # them is read only by the lane's own probe (``probe``), never by the agent's call.
            offered = ", ".join(tools) or "none"
            return tool_error_result(
                f"salvor's MCP server offers no tool {name!r} to this run (it offers: {offered})"
            )
        try:
            validate(tool.input_schema, arguments, what=f"the {name} call")
            outcome = await self._perform(tool, arguments, call, params.get(PLAN_FIELD))
        except SchemaViolation as exc:
            return tool_error_result(exc.message)
        except ToolFailed as exc:
            if exc.retryable:
                raise
            return tool_error_result(exc.message)
        if name == FlowTool.ATTACH_TOOL and isinstance(outcome, dict):
            self.attach(outcome.get("attached") or [])
        if isinstance(outcome, Suspend):
            # The same request any MCP server makes to park its run: the lane parks it.
            return {
                "content": [{"type": "text", "text": f"waiting for an answer: {outcome.reason}"}],
                "_meta": {
                    "salvor": {
                        "suspend": {"reason": outcome.reason, "input_schema": outcome.input_schema}
                    }
                },
            }
        return stub_result(outcome)


def salvor_server(
    run_id: str,
    labels: Mapping[str, str] | None,
    outputs: Sequence[DeclaredOutput],
    host: FlowHost | None,
    files: FileTools | None = None,
    *,
    attached: Sequence[str] = (),
    skills: Sequence[Skill] = (),
) -> FlowServer:
    """The ``salvor`` server of a process run: its flow session from its labels (a child of a
    parent's subagent call or a map is a child session), every flow tool opted into, the
    registry tools ``attached`` to its tree (which children it starts inherit), and the agent's
    ``skills``, advertised in its instructions."""
    session = FlowSession(
        run_id=run_id,
        session=session_of(labels),
        autonomous=is_autonomous(labels),
        opted_in=tuple(FlowTool),
        outputs=tuple(outputs),
        host=host,
        attached=tuple(attached),
    )
    return FlowServer(
        session, files, resolve=None if host is None else host.registry_tool, skills=skills
    )


def key_fields(
    spec: McpServerSpec, relay: FlowServer | None, method: str, name: Any
) -> tuple[tuple[str, ...], str | None]:
    """The key fields of a lane's request ``method`` calling ``name`` (none but a ``tools/call``
    of a keyed tool), and the server its identity names: the lane's ``spec``'s, or, for a tool
    the ``salvor`` server (``relay``) relays, the tool's own (an attached server's; none for a
    registry tool), the identity a built-in agent's call of the same tool claims, so the two
    are deduplicated together."""
    if method != "tools/call" or not isinstance(name, str):
        return (), spec.name
    relayed = None if relay is None else relay.attached.get(name)
    server = spec.name if relayed is None else relayed.mcp_server
    return tuple(spec.key_paths(name)), server


def relays_registry_tool(relay: FlowServer | None, method: str, name: Any) -> bool:
    """Whether a lane's request ``method`` calling ``name`` is a registry tool the ``salvor``
    server (``relay``) relays: one whose outcome a built-in agent's call records bare."""
    if relay is None or method != "tools/call" or not isinstance(name, str):
        return False
    relayed = relay.attached.get(name)
    return relayed is not None and relayed.mcp_server is None


async def probe_request(
    live: McpSession | FlowServer, probe: str, arguments: Any, attempt: ToolCall
) -> Any:
    """The raw result of the lane's own probe ``probe`` sent to ``live``: a server's
    ``tools/call``, or the ``salvor`` server's relay of an attached probe, on a path of its own
    that no request of the agent takes.

    Raises:
        McpError: as the server's call does.
        ToolFailed: as an attached registry write's probe does.
    """
    if isinstance(live, FlowServer):
        return await live.probe(probe, arguments, attempt)
    return await live.request("tools/call", {"name": probe, "arguments": arguments}, key=None)
