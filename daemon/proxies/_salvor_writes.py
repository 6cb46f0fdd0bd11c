"""A process agent's ``write`` or ``edit`` through the ``salvor`` server: planned before its
intent is recorded, and probed when a crash leaves it open, as a built-in agent's are.

The lane records the agent's request whole, so the plan (``files.plan_input`` asked of the
agent's planner: the digest of what the file holds and of what it is to hold) rides in the
intent's input beside it, as ``expect``, and the intent's idempotency key is the path and the
intended bytes (``files.content_key``). The lane matches a request by its name and arguments
only, so the plan never makes a replay diverge; an ``expect`` the agent sends itself is dropped
from the record, so only salvor's plan is ever performed or probed by. The write is performed
from the recorded plan (``FlowServer`` is sent the recorded input), which leaves a file already
holding the intended bytes alone and refuses one that holds neither: a retried write lands once.
A plan that refuses (a path outside the agent's write globs, an ``old_text`` not found) is the
call's answer, recorded with its intent: nothing is written.

Found open after a crash, the write is probed (``files.WRITE_PROBE``, the agent's
``file_holds``) while the agent, replaying, waits on it: the file holds the intended bytes, its
completion is recorded (``settled_by: "probe"``) with the very result the write answers; it
holds what the plan found, it is performed from the plan; anything else (someone changed the
file since), the run waits for a person. An intent recorded without a plan (a daemon before
this one recorded it) has no probe and waits for a person, as it did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..files import PLAN_FIELD, WRITE_PROBE, content_key, plan_input
from ..mcp import McpServerSpec
from ..tools import WRITE_TOOLS, DispatchFailed, Probe, Tool, ToolCall, dispatch
from ._flow_server import SALVOR_SERVER, FlowServer, tool_error_result
from ._mcp_replay import lane_probe, lane_tool, stub_result

_SALVOR_CALL = lane_tool(SALVOR_SERVER, "tools/call")


def planned_write(tool: str | None, tool_input: Any) -> dict | None:
    """The plan the ``salvor`` lane's write or edit recorded with its intent (``tool`` and
    ``tool_input``: the intent's), or None (another call, or a write recorded without one)."""
    if tool != _SALVOR_CALL or not isinstance(tool_input, dict):
        return None
    if tool_input.get("name") not in WRITE_TOOLS:
        return None
    plan = tool_input.get(PLAN_FIELD)
    return plan if isinstance(plan, dict) else None


def probes_lane_write(specs: Sequence[McpServerSpec], tool: str | None, tool_input: Any) -> bool:
    """Whether a process agent's open write, recorded as ``tool`` with ``tool_input``, is probed
    when its drive reaches it: its server (among ``specs``, the agent's) declares a probe, or it
    is a file write the ``salvor`` lane planned."""
    return (
        lane_probe(specs, tool, tool_input) is not None
        or planned_write(tool, tool_input) is not None
    )


async def plan_lane_write(
    server: FlowServer | None, method: str, asked: dict, run_id: str, seq: int
) -> tuple[dict, str | None, dict | None]:
    """What a lane records of the request ``asked`` whose intent goes at ``seq``: its input, its
    write key, and (a write or edit whose plan refused) the call's output, to record with the
    intent; ``asked`` as it is on any lane but the ``salvor`` server's (``server``).

    The plan is a read of the workspace (retried as a read is), made before anything is
    recorded: a crash during it leaves nothing behind.
    """
    if server is None or method != "tools/call":
        return asked, None, None
    recorded = {key: value for key, value in asked.items() if key != PLAN_FIELD}
    name, arguments = recorded.get("name"), recorded.get("arguments", {})
    planner = server.planner_of(name, arguments)
    if planner is None:
        return recorded, None, None
    try:
        plan, _ = await dispatch(
            planner, plan_input(name, arguments), run_id=run_id, seq=seq, key=None
        )
    except DispatchFailed as failed:
        return recorded, None, {"result": tool_error_result(failed.message)}
    return {**recorded, PLAN_FIELD: plan}, content_key(plan), None


def lane_write_probe(server: FlowServer | None, tool_input: Any) -> tuple[Probe, Tool, dict] | None:
    """The probe of the ``salvor`` lane's open write recorded with ``tool_input``, the read that
    answers it (the agent's ``file_holds``), and the input it reads the plan from; None when it
    is no planned file write."""
    prober = None if server is None else server.prober
    if prober is None or planned_write(_SALVOR_CALL, tool_input) is None:
        return None

    async def holds(probe_input: Any, call: ToolCall) -> Any:
        answer = await prober.handler(probe_input, call)
        if isinstance(answer, dict) and answer.get("landed") is True:
            # Landed: the agent is answered exactly as the write answers when it performs.
            return {**answer, "output": stub_result(answer.get("output"))}
        return answer

    return WRITE_PROBE, replace(prober, handler=holds), tool_input
