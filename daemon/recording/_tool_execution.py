"""Running a tool's handler for a drive: validated, behind the drive's gate, dispatched.

A call's handler (``executed_output``) runs once its intent is durable; what it yields is what
the completion records, a failure included (salvor's tool error). A write's probe
(``probe_write``) runs a read when the write's outcome is unknown. A probe claims nothing,
presents no key, writes nothing to the log before its verdict, and is retried as ``dispatch``
retries a read, within ``PROBE_SECONDS`` for a native one. Every probe's answer is recorded for
the reconciliation queue (``store.claims.put_probe_answer``), so a drive killed mid-probe leaves
the same open intent for the next one. What is done with the verdict is the caller's:
``RunContext`` for a built-in agent, the MCP lane for a process agent.
"""

from __future__ import annotations

import math
from typing import Any

import trio
from salvor.protocol import SchemaViolation, validate

from ..tools import (
    DispatchFailed,
    NotPerformed,
    Probe,
    ProbeVerdict,
    SleepUntil,
    Suspend,
    Tool,
    dispatch,
)
from ._store_access import StoreAccess
from ._tool_outcomes import outcome_output, tool_error

# How long a native probe may take, its read retries included. An MCP probe
# is bounded by its server's `timeout` on each attempt instead.
PROBE_SECONDS = 30.0


async def executed_output(
    access: StoreAccess, run_id: str, tool: Tool, tool_input: Any, seq: int, key: str | None
) -> Any:
    """What the call at ``seq`` of run ``run_id`` records as its output once its handler ran.

    An input its schema refuses, or a handler that failed past its retries, is recorded as
    salvor's tool error: the model is told and the run goes on.

    Raises:
        OutcomeUnknown: the handler cannot tell whether its write landed.
        NotPerformed: the handler could not perform the call now; nothing of it happened.
    """
    try:
        validate(tool.input_schema, tool_input, what=f"the input of tool {tool.name}")
    except SchemaViolation as exc:
        return tool_error("invalid_input", exc.message, 1)
    access.driving.gate(run_id)
    try:
        outcome, attempt = await dispatch(tool, tool_input, run_id=run_id, seq=seq, key=key)
    except DispatchFailed as failed:
        return tool_error("handler", failed.message, failed.attempts)
    return outcome_output(tool, outcome, attempt)


async def probe_write(
    access: StoreAccess, run_id: str, probe: Probe, reader: Tool, write_input: Any, seq: int
) -> tuple[ProbeVerdict, Any, dict]:
    """Run ``reader`` as ``probe`` says of run ``run_id``'s open write at ``seq``; the verdict,
    the write's output, and the evidence.

    Whatever keeps the probe from answering (a missing input field, a failure, the bound) is
    recorded as its error and cannot tell.

    Raises:
        StoreUnavailable: the answer could not be recorded; nothing was
            written and the write's intent is still open.
    """
    answer: Any = None
    try:
        probe_input = probe.probe_input(write_input)
    except KeyError as missing:
        probe_input = {}
        error = (
            f"the write's input has no `{missing.args[0]}`, which the probe "
            f"{reader.name}'s input is taken from"
        )
    else:
        answer, error = await _ask_probe(access, run_id, reader, probe_input, seq)
    verdict, output = (ProbeVerdict.UNKNOWN, None) if error else probe.verdict(answer)
    await access.read(
        lambda: access.store.claims.put_probe_answer(
            run_id,
            seq,
            tool=reader.name,
            probe_input=probe_input,
            answer=answer,
            error=error,
            verdict=verdict.value,
        )
    )
    return verdict, output, {"tool": reader.name, "input": probe_input, "answer": answer}


async def _ask_probe(
    access: StoreAccess, run_id: str, reader: Tool, probe_input: dict, seq: int
) -> tuple[Any, str | None]:
    """The probe's answer and None, or None and why it gave none."""
    try:
        validate(reader.input_schema, probe_input, what=f"the input of probe {reader.name}")
    except SchemaViolation as exc:
        return None, exc.message
    bound = PROBE_SECONDS if reader.mcp_server is None else math.inf
    access.driving.gate(run_id)
    try:
        with trio.fail_after(bound):
            outcome, _ = await dispatch(reader, probe_input, run_id=run_id, seq=seq, key=None)
    except trio.TooSlowError:
        return None, f"the probe {reader.name} gave no answer within {bound:g}s"
    except (DispatchFailed, NotPerformed) as failed:
        return None, f"the probe {reader.name} failed: {failed.message}"
    if isinstance(outcome, Suspend | SleepUntil):
        return None, f"the probe {reader.name} asked to park the run, which a probe cannot do"
    return outcome, None
