"""How a process agent's MCP exchanges sit in its log, and how a later one differs from them.

Every request the agent sends one of its MCP servers is one tool call in the
run's log, named ``mcp:<server>/<method>`` (the name the built-in agents give
a recorded ``tools/list``). Its input is the request's ``params`` without
``_meta`` (progress tokens and the like are the client's, not the call's:
they go to a live server but are neither recorded nor matched);
its output is the JSON-RPC answer without ``jsonrpc``/``id``: ``{"result":
...}`` or ``{"error": ...}``, or the ``__salvor_error`` sentinel when salvor
could not get an answer at all. The notifications the server sent since the
lane's previous answer ride along as ``notifications``: each with its
``after`` anchor (how many of the lane's calls were answered when it
crossed), replayed with the answer and never matched. A server's exchanges,
in log order, are its lane; lanes are matched strictly by position, each on
its own, by the replay lane (``salvor.protocol.ReplayLane``).

A ``tools/call`` whose result parked the run (``_meta.salvor``) records the
server's result beside the wait's sentinel (``__salvor_suspend`` or
``__salvor_sleep``), and the wait's own events (``Suspended`` then
``Resumed``, or ``SleepStarted`` then the clock reading and
``SleepCompleted``) follow its completion in the log: they belong to the
call, and say what the agent is answered once the wait ended.

Matching a request against the one recorded at its position: the method
first, then (for ``tools/call``) the tool name, then a field-level diff of
the arguments (of the whole ``params`` for other methods) naming the first
divergent path. For ``initialize`` only ``protocolVersion`` is matched:
``clientInfo`` and ``capabilities`` change with a client library's patch
release and say nothing about the run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from salvor.protocol import (
    TOOL_ERROR_KEY,
    CallNames,
    DivergenceReason,
    Envelope,
    Event,
    EventKind,
    Mismatch,
    Resumed,
    SleepCompleted,
    SleepStarted,
)

from ..mcp import McpServerSpec
from ..recording import slept, wait_event
from ..tools import Probe

INTERNAL_ERROR = -32603


def lane_tool(server: str, method: str) -> str:
    """The tool name a request of ``method`` to ``server`` carries in the log."""
    return f"mcp:{server}/{method}"


def lane_probe(specs: Sequence[McpServerSpec], tool: str | None, tool_input: Any) -> Probe | None:
    """The probe a process agent's server declares for the lane call recorded as ``tool`` with
    ``tool_input`` (a ``tools/call`` of one of its writes), or None."""
    name = tool_input.get("name") if isinstance(tool_input, dict) else None
    if not isinstance(name, str):
        return None
    for spec in specs:
        if tool == lane_tool(spec.name, "tools/call"):
            return spec.probe_of(name) if spec.exposes(name) else None
    return None


def lane_names(server: str) -> CallNames:
    """How the replay lane of ``server`` names its calls in a divergence or a shortfall."""
    return CallNames(
        one=f"MCP server {server!r} (lane {lane_tool(server, '')}), call",
        many=f"calls of MCP server {server!r}",
    )


def call_input(params: dict) -> dict:
    """What the log keeps of a request's params."""
    return {k: v for k, v in params.items() if k != "_meta"}


@dataclass(slots=True)
class LaneCall:
    """One recorded exchange of a lane: its intent's seq, what was asked,
    and the answer once there is one.

    ``seq``, ``completed`` and ``effect`` are what the replay lane's rules read (``Recorded``).
    """

    seq: int
    method: str
    input: Any
    effect: str
    idempotency_key: str | None
    output: Any = None
    completed: bool = False
    # The events of the wait its result parked the run in, as far as the log holds them.
    wait: list[Event] = field(default_factory=list)

    def woken(self) -> tuple[bool, Any]:
        """Whether the wait this call parked the run in has ended, and what
        the call returns now that it has.

        A suspension returns the input the run was resumed with; a sleep
        ``{"slept_until": ...}``, as a built-in agent's tool call does.
        """
        last = self.wait[-1] if self.wait else None
        if isinstance(last, Resumed):
            return True, last.input
        if isinstance(last, SleepCompleted) and isinstance(self.wait[0], SleepStarted):
            return True, slept(self.wait[0].wake_at)
        return False, None


# What may follow a parking call's completion: the event starting its
# wait, then the rest of the wait.
_WAIT_STARTS = (EventKind.SUSPENDED, EventKind.SLEEP_STARTED)
_WAIT_GOES_ON = (EventKind.RESUMED, EventKind.NOW_OBSERVED, EventKind.SLEEP_COMPLETED)
_WAIT_ENDS = (EventKind.RESUMED, EventKind.SLEEP_COMPLETED)


def lane_calls(log: Sequence[Envelope], server: str) -> list[LaneCall]:
    """The exchanges of ``server``'s lane in ``log``, in order, each with
    the wait it parked the run in."""
    prefix = lane_tool(server, "")
    calls: list[LaneCall] = []
    by_seq: dict[int, LaneCall] = {}
    waiting: LaneCall | None = None
    for env in log:
        event = env.event
        if event.KIND is EventKind.TOOLS_ATTACHED:
            continue  # recorded wherever the run rested, a wait included: it narrates only
        if waiting is not None:
            if event.KIND in (_WAIT_GOES_ON if waiting.wait else _WAIT_STARTS):
                waiting.wait.append(event)
                if event.KIND in _WAIT_ENDS:
                    waiting = None
                continue
            waiting = None
        if event.KIND is EventKind.TOOL_CALL_REQUESTED and event.tool.startswith(prefix):
            call = LaneCall(
                env.seq, event.tool[len(prefix) :], event.input, event.effect, event.idempotency_key
            )
            calls.append(call)
            by_seq[env.seq] = call
        elif event.KIND is EventKind.TOOL_CALL_COMPLETED and event.seq in by_seq:
            call = by_seq[event.seq]
            call.output, call.completed = event.output, True
            if wait_event(event.output) is not None:
                waiting = call
    return calls


def _path(base: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{base}[{key}]"
    return f"{base}.{key}" if base else str(key)


# Recursion: one frame per level; an agent's MCP message is at most MAX_NESTING (128) levels deep
# (the stand-in parses it strictly), far under Python's limit of 1000.
def first_divergence(recorded: Any, asked: Any, path: str = "") -> str | None:
    """The path of the first field where ``asked`` differs from
    ``recorded``; None when they are equal.

    Object keys are compared in sorted order, so the path is the same
    whatever order either side wrote its keys in.
    """
    if isinstance(recorded, dict) and isinstance(asked, dict):
        for key in sorted(set(recorded) | set(asked)):
            if key not in recorded or key not in asked:
                return _path(path, key)
            found = first_divergence(recorded[key], asked[key], _path(path, key))
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(asked, list):
        for index, (left, right) in enumerate(zip(recorded, asked, strict=False)):
            found = first_divergence(left, right, _path(path, index))
            if found is not None:
                return found
        if len(recorded) != len(asked):
            return _path(path, min(len(recorded), len(asked)))
        return None
    # bool is an int to Python, never to JSON.
    same = type(recorded) is type(asked) or (
        isinstance(recorded, int | float)
        and isinstance(asked, int | float)
        and not isinstance(recorded, bool)
        and not isinstance(asked, bool)
    )
    return None if same and recorded == asked else (path or "(the whole value)")


_ABSENT = object()


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "nothing"
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def _at(value: Any, path: str) -> Any:
    """The value at a path ``first_divergence`` named (``_ABSENT`` when there is none)."""
    for part in path.replace("[", ".[").split("."):
        if not part:
            continue
        key: Any = int(part[1:-1]) if part.startswith("[") else part
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return _ABSENT
    return value


def mismatch(recorded: LaneCall, method: str, asked: dict) -> Mismatch | None:
    """How a request differs from the recorded one at its position; None when it matches."""
    if recorded.method != method:
        return Mismatch(
            DivergenceReason.KIND,
            f"the agent sent {method} where the log records {recorded.method}",
        )
    before = recorded.input if isinstance(recorded.input, dict) else {}
    if method == "tools/call":
        if before.get("name") != asked.get("name"):
            return Mismatch(
                DivergenceReason.REQUEST,
                (
                    f"the agent called the tool {asked.get('name')!r} where the log "
                    f"records {before.get('name')!r}"
                ),
            )
        before, asked, where = before.get("arguments"), asked.get("arguments"), "arguments"
    elif method == "initialize":
        before = {"protocolVersion": before.get("protocolVersion")}
        asked, where = {"protocolVersion": asked.get("protocolVersion")}, "params"
    else:
        where = "params"
    # Wrapped, so every path starts at the field named and the values at it can be read back.
    before, asked = {where: before}, {where: asked}
    path = first_divergence(before, asked)
    if path is None:
        return None
    return Mismatch(
        DivergenceReason.REQUEST,
        (
            f"its {method} differs at `{path}`: the agent sent {_shown(_at(asked, path))} where "
            f"the log records {_shown(_at(before, path))}"
        ),
    )


def answer_of(request_id: Any, output: Any) -> dict:
    """The JSON-RPC answer a recorded output gives the request ``request_id``."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    if isinstance(output, dict) and "result" in output:
        message["result"] = output["result"]
    elif isinstance(output, dict) and isinstance(output.get("error"), dict):
        message["error"] = output["error"]
    elif isinstance(output, dict) and isinstance(output.get(TOOL_ERROR_KEY), dict):
        message["error"] = {
            "code": INTERNAL_ERROR,
            "message": str(output[TOOL_ERROR_KEY].get("message", "")),
        }
    else:
        message["error"] = {
            "code": INTERNAL_ERROR,
            "message": "salvor recorded no usable answer for this request",
        }
    return message


def notifications_of(output: Any) -> list[dict]:
    """The server notifications recorded with an answer, to go to the agent just before it."""
    notes = output.get("notifications") if isinstance(output, dict) else None
    if not isinstance(notes, list):
        return []
    return [
        n["message"] for n in notes if isinstance(n, dict) and isinstance(n.get("message"), dict)
    ]


def error_answer(request_id: Any, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def stub_result(fixed: Any) -> dict:
    """The ``tools/call`` result of a tool the definition answers itself (``results``)."""
    if isinstance(fixed, dict) and isinstance(fixed.get("content"), list):
        return fixed
    text = (
        fixed if isinstance(fixed, str) else json.dumps(fixed, ensure_ascii=False, sort_keys=True)
    )
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    if isinstance(fixed, dict):
        result["structuredContent"] = fixed
    return result


def call_failed(output: Any) -> bool:
    """Whether a lane call's recorded output is a failure: salvor's tool error,
    the server's JSON-RPC error, or a result flagged ``isError``."""
    if not isinstance(output, dict):
        return False
    result = output.get("result")
    return (
        TOOL_ERROR_KEY in output
        or "error" in output
        or (isinstance(result, dict) and result.get("isError") is True)
    )


def copied_output(recorded: Any, *, registry: bool = False) -> dict:
    """What a call copying another call's settled outcome records: that call's result.

    A lane records ``{"result": ...}`` (with the notifications and server
    requests of its own exchange, which are not this call's); a built-in
    agent's MCP call of the same identity records the result itself, and its call of a
    ``registry`` tool (one the ``salvor`` server relays) the bare outcome, answered here as the
    relay answers a performed call (``stub_result``).
    """
    if registry:
        lane = recorded.get("result") if isinstance(recorded, dict) else None
        relayed = isinstance(lane, dict) and isinstance(lane.get("content"), list)
        return {"result": lane if relayed else stub_result(recorded)}
    if isinstance(recorded, dict) and "result" in recorded:
        return {"result": recorded["result"]}
    return {"result": recorded}
