"""A refusal's next step in an HTTP caller's words: the route it calls, with the body it sends.

An HTTP caller may have no shell on the daemon's machine, so a step is never a ``salvor``
command here; the one exception is what only the daemon's operator can do (its start-up flags),
which is named as the operator's.
"""

from __future__ import annotations

from salvor.protocol import NextStep, StepKind, Wording


def _await_wake(step: NextStep) -> str:
    return (
        f"it is not waiting on input, and this daemon's wake sweeper drives it by itself once "
        f"{step.wake_at} passes (when the daemon holds the agent or graph the run recorded, and "
        f"unless its operator turned the sweeper off); from that instant on "
        f"POST /v1/runs/{step.run}/resume wakes it at once"
    )


HTTP_WORDING: Wording = {
    StepKind.RESOLVE_WRITE: lambda s: (
        f"check it, then record what it returned with POST /v1/runs/{s.run}/resolve and the "
        'body {"output": <what it returned>}, or {"not_landed": true} if it did not happen'
    ),
    StepKind.RESOLVE_THEN_FORK: lambda s: (
        f"record what it did first, with POST /v1/runs/{s.run}/resolve and the body "
        '{"output": <what it returned>}, then fork'
    ),
    StepKind.RESUME_RUN: lambda s: f"POST /v1/runs/{s.run}/resume finishes it",
    StepKind.REGISTER_AGENT: lambda s: (
        "register its definition with POST /v1/agents, then ask again"
    ),
    StepKind.AWAIT_WAKE: _await_wake,
    StepKind.DECLARE_CLIENT_TOOL: lambda s: (
        f"this daemon's operator loads its declaration (--client-tool) when starting the daemon; "
        f"then POST /v1/runs/{s.run}/resolve checks the output against it"
    ),
}
