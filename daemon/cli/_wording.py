"""A refusal's next step in a shell user's words: the ``salvor`` command that takes it."""

from __future__ import annotations

from salvor.protocol import StepKind, Wording

CLI_WORDING: Wording = {
    StepKind.RESOLVE_WRITE: lambda s: (
        f"check it, then record what it returned with `salvor resolve {s.run} --output JSON`, "
        f"or `salvor reconcile {s.run} --not-landed` if it did not happen"
    ),
    StepKind.RESOLVE_THEN_FORK: lambda s: (
        f"record what it did first with `salvor resolve {s.run} --output JSON`, then fork"
    ),
    StepKind.RESUME_RUN: lambda s: f"`salvor resume {s.run}` finishes it",
    StepKind.REGISTER_AGENT: lambda s: (
        "`salvor run AGENT_FILE` stores the agent its file defines (and starts a run of it)"
    ),
    StepKind.AWAIT_WAKE: lambda s: (
        f"it is not waiting on input: once {s.wake_at} passes, a serving daemon's wake sweeper "
        "continues it, or `salvor wake` does"
    ),
    StepKind.DECLARE_CLIENT_TOOL: lambda s: (
        f"give its declaration with `salvor resolve {s.run} --output JSON --client-tool FILE` "
        "(or start `salvor serve` with it to resolve over HTTP)"
    ),
}
