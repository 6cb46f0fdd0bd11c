"""How an agent process's drive ends its run, once the process is gone.

Exit 0 completes the run with its result: the agent's good ``finish``
on the ``salvor`` MCP server when it made one (exactly the checked result, with
or without a model call), else its standard output when the definition says
``output_from = "stdout"`` (stripped, its last ``STDOUT_TAIL_BYTES``), else the
final answer of the trajectory (``final_answer``: its text, or the tool calls it
ended on); a non-zero exit fails it with the exit code and the tail of its
stderr; an exit 0 with no model call and no finish fails with the diagnosis that
the client never honoured the injected base URL, and one whose model calls never
carried the run's prompt (a text input) fails saying the task never reached the
model; a timeout kills the whole process group and fails the run. A process
killed by a signal leaves the run recoverable (``DriveInterrupted``): the next
drive starts it again.

A service agent's drive ends the same ways where they apply (``superseded_view``,
``final_answer``, ``replay_shortfall``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from salvor.protocol import RunCompleted, RunFailed, RunState, RunView

from ..proxies import McpLane, ProxySession, final_text, final_tool_calls
from ..recording import DriveInterrupted, RunContext
from ._agent_definition import AgentDefinition


async def superseded_view(ctx: RunContext) -> RunView:
    """Where the run is after another writer appended under this drive (``session.superseded``):
    the log says, not the agent's exit. An ended run (abandoned beside this daemon) is returned
    as that writer left it.

    Raises:
        DriveInterrupted: the run did not end; it keeps its log, for a later drive to go on from.
    """
    run_id = ctx.run_id
    view = await ctx.access.read(ctx.access.store.read_view, run_id)
    if view is not None and view.terminal:
        return view
    raise DriveInterrupted(
        f"another writer appended to run {run_id} while this drive ran; the run keeps its "
        f"log, and `salvor resume {run_id}` goes on from it"
    )


async def settle_process(
    ctx: RunContext,
    session: ProxySession,
    lanes: Mapping[str, McpLane],
    agent: AgentDefinition,
    code: int,
    timed_out: bool,
    stderr: str,
    stdout: str | None = None,
) -> RunView:
    """End the run as the process's exit says (``stdout``: what it printed, when the run answers
    there), unless the session or the log ended it already; the run's view after.

    Raises:
        CodedError: the store failed under one of its calls (the session's store fault).
        DriveInterrupted: a lane stopped the drive, another writer appended under it, or a signal
            killed the process; the run keeps its log.
    """
    if session.store_fault is not None:
        # The process ended because the store failed under its call, not by its own doing.
        raise session.store_fault
    if session.interrupted is not None:
        # A lane stopped the drive before its call was written (another run holds its key).
        raise session.interrupted
    if session.superseded is not None:
        return await superseded_view(ctx)
    if (
        session.rested.is_set()
        or ctx.view.terminal
        or ctx.view.state is RunState.NEEDS_RECONCILIATION
    ):
        # Failed or parked already (an MCP write cut off mid-call parks it): the log says why.
        return ctx.view
    failure = _exit_failure(session, lanes, agent, code, timed_out, stderr, ctx.run_id)
    if failure is None:
        await ctx.record(RunCompleted(output=run_output(session, stdout)))
    else:
        await ctx.record(RunFailed(error=failure))
    return ctx.view


def _exit_failure(
    session: ProxySession,
    lanes: Mapping[str, McpLane],
    agent: AgentDefinition,
    code: int,
    timed_out: bool,
    stderr: str,
    run_id: str,
) -> str | None:
    """Why a run whose agent process exited (``code``) without a recorded end fails, or None
    when the exit completes it.

    Raises:
        DriveInterrupted: a signal killed the process; the run keeps its log for a resume.
    """
    tail = f"; its stderr ended with:\n{stderr}" if stderr else "; it printed nothing to stderr"
    if timed_out:
        failure = (
            "the agent process ran past its timeout of "
            f"{agent.process.timeout:g}s; its process group was killed"
        )
    elif code < 0:
        raise DriveInterrupted(
            f"the agent process of run {run_id} was killed by signal {-code}; the run keeps its "
            f"log, and `salvor resume {run_id}` starts it again with the recorded "
            "model calls answered from the log"
        )
    elif code != 0:
        when = " before any model call" if not session.calls else ""
        failure = f"the agent process exited with code {code}{when}{tail}"
    elif not session.calls and session.finished is None:
        failure = (
            "the agent process exited 0 without making any model call or calling `finish`: its "
            "client never reached the salvor proxy. Point it at OPENAI_BASE_URL (OpenAI clients) "
            "or ANTHROPIC_BASE_URL (Anthropic clients), which salvor sets; or map them in the "
            "definition's `env` for a client that reads another variable"
        )
    elif (short := replay_shortfall(session, "the agent process exited 0")) is not None:
        failure = short
    elif (
        unreached := next((n for lane in lanes.values() if (n := lane.never_contacted())), None)
    ) is not None:
        failure = unreached
    elif short := next(
        (n for lane in lanes.values() if (n := lane.shortfall("the agent process exited 0"))), None
    ):
        failure = short
    elif session.finished is None and session.task is not None and not session.task_reached:
        count = len(session.calls)
        failure = (
            f"the agent process exited 0, but none of its {count} model "
            f"{'call' if count == 1 else 'calls'} carried the run's prompt: the task never "
            "reached its model, so what it answered is not an answer to it. Give the program its "
            "prompt: a `{prompt}` element in `command` becomes the prompt as one argument, and "
            "SALVOR_PROMPT holds it in the environment"
        )
    else:
        return None
    return failure


def run_output(session: ProxySession, stdout: str | None) -> Any:
    """What a process run that exited 0 completes with.

    Its good ``finish`` when it made one (the checked result, as a child's
    parent reads it); else, with ``"exit_code": 0``, its standard output as
    ``"reply"`` when it answers there (``stdout``, nothing when it printed
    nothing), else its ``final_answer``.
    """
    if session.finished is not None:
        return session.finished
    if stdout is None:
        return {**final_answer(session), "exit_code": 0}
    reply = stdout or None
    return {"exit_code": 0} if reply is None else {"reply": reply, "exit_code": 0}


def final_answer(session: ProxySession) -> dict[str, Any]:
    """What the drive's last answered model call answered, as a run's output holds it.

    ``{"reply": <text>}`` when it answered in text; ``{"tool_calls": [{"name",
    "arguments"}, ...]}`` when it called tools, in the model's order, each call's
    arguments parsed from their JSON: a framework that ends on a tool call (smolagents'
    ``final_answer``) answers there, and the model never hears back; ``{}`` when no
    call was answered.
    """
    last = next((c for c in reversed(session.calls) if c.response is not None), None)
    if last is None:
        return {}
    wire = last.response.get("wire")
    if calls := final_tool_calls(wire, last.response):
        return {"tool_calls": calls}
    text = final_text(wire, last.response)
    return {} if text is None else {"reply": text}


def replay_shortfall(session: ProxySession, what_ended: str) -> str | None:
    """Why a drive that ended before making every call it had to reproduce fails;
    None when it made them all."""
    short = session.replay.shortfall(what_ended)
    return None if short is None else short.message
