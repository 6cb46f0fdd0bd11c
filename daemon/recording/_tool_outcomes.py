"""What a tool call records as its output, and what a recorded output asks of the run.

A handler's outcome is recorded as it is, except that a parking outcome (``Suspend``,
``SleepUntil``) becomes its sentinel and a failure becomes salvor's tool error. Reading an
output back says whether the run must wait (``wait_event``) and whether another caller of the
same identity may copy it (``leaves_no_outcome``). Pure: nothing here reads or writes the store.
"""

from __future__ import annotations

from typing import Any

from salvor.protocol import (
    TOOL_ERROR_KEY,
    TOOL_SLEEP_KEY,
    TOOL_SUSPEND_KEY,
    MalformedEvent,
    SleepStarted,
    Suspended,
    check_schema,
    format_instant,
)

from ..tools import SleepUntil, Suspend, Tool


def leaves_no_outcome(tool: Tool, output: Any) -> bool:
    """Whether a call's recorded output is a failure no other caller may copy: salvor's tool
    error, or an MCP server's result flagged ``isError`` (the server said the call failed)."""
    if not isinstance(output, dict):
        return False
    return TOOL_ERROR_KEY in output or (
        tool.mcp_server is not None and output.get("isError") is True
    )


def tool_error(kind: str, message: str, attempts: int) -> dict:
    """The ``__salvor_error`` sentinel a failed tool call records as its output."""
    return {
        TOOL_ERROR_KEY: {"is_error": True, "kind": kind, "message": message, "attempts": attempts}
    }


def outcome_output(tool: Tool, outcome: Any, attempt: int) -> Any:
    """What a tool's outcome records as its output: a parking outcome becomes its sentinel."""
    if isinstance(outcome, Suspend):
        try:
            check_schema(outcome.input_schema)
        except MalformedEvent as exc:
            return tool_error("output_serialization", f"suspension schema: {exc.message}", attempt)
        body = {"reason": outcome.reason, "input_schema": outcome.input_schema}
        if outcome.kind is not None:
            body["kind"] = outcome.kind
        return {TOOL_SUSPEND_KEY: body}
    if isinstance(outcome, SleepUntil):
        return {TOOL_SLEEP_KEY: {"wake_at": format_instant(outcome.wake_at)}}
    return outcome


def wait_event(output: Any) -> Suspended | SleepStarted | None:
    """The event that starts the wait a tool's recorded output asks for;
    None when it asks for none."""
    if not isinstance(output, dict):
        return None
    if TOOL_SUSPEND_KEY in output:
        spec = output[TOOL_SUSPEND_KEY]
        return Suspended(
            reason=spec["reason"], input_schema=spec["input_schema"], kind=spec.get("kind")
        )
    if TOOL_SLEEP_KEY in output:
        return SleepStarted(wake_at=output[TOOL_SLEEP_KEY]["wake_at"])
    return None


def slept(wake_at: str) -> dict:
    """What a tool call that slept returns once the run wakes."""
    return {"slept_until": wake_at}
