"""Errors raised by the pure core, split by who is at fault.

Every salvor error carries the control-plane ``code`` it maps to
(``CodedError``), and its HTTP ``status`` is that code's in the one table
(``_error_codes.py``), so the API layer and the CLI report any of them the
same way, without a second mapping. A base class is never raised
directly: raise the subclass that names the fault.

A refusal that has a way out carries it as data (``NextStep``): what to do
and to which run, never the words for it. Each surface words the step as
its own action (an HTTP caller is told a route, a shell user a command)
through a ``Wording`` table; ``message`` words it for a reader of no
particular surface (a log line, a tool error an agent reads).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ._error_codes import ErrorCode

# How much of a caller's text a message may quote: enough to recognise it, never a whole body.
EXCERPT_CHARS = 64


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """At most ``limit`` characters of ``text`` for an error message, with "…" when it was cut."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "…"


class StepKind(enum.StrEnum):
    """What a refused caller does next, whatever surface it stands on."""

    # Record what the run's open write did (it may or may not have happened).
    RESOLVE_WRITE = "resolve_write"
    # The same, for the origin of a fork, and then fork again.
    RESOLVE_THEN_FORK = "resolve_then_fork"
    # Continue the run: nothing but a drive is missing.
    RESUME_RUN = "resume_run"
    # Register the agent the request (or the run) names, then ask again.
    REGISTER_AGENT = "register_agent"
    # Nothing: the run's timer wakes it at ``wake_at``; a re-drive from then on wakes it at once.
    AWAIT_WAKE = "await_wake"
    # Load the declaration of client tool ``tool`` where the resolve is checked, then resolve.
    DECLARE_CLIENT_TOOL = "declare_client_tool"


# The fields each kind needs; a step built without one is a bug at its call site.
_STEP_NEEDS: Mapping[StepKind, frozenset[str]] = {
    StepKind.RESOLVE_WRITE: frozenset({"run"}),
    StepKind.RESOLVE_THEN_FORK: frozenset({"run"}),
    StepKind.RESUME_RUN: frozenset({"run"}),
    StepKind.REGISTER_AGENT: frozenset(),
    StepKind.AWAIT_WAKE: frozenset({"run", "wake_at"}),
    StepKind.DECLARE_CLIENT_TOOL: frozenset({"run", "tool"}),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class NextStep:
    """A refusal's way out, as data: its kind and what it acts on."""

    kind: StepKind
    run: str | None = None
    wake_at: str | None = None
    tool: str | None = None

    def __post_init__(self) -> None:
        missing = sorted(f for f in _STEP_NEEDS[self.kind] if getattr(self, f) is None)
        if missing:
            raise TypeError(f"a {self.kind} step needs {', '.join(missing)}")


# How a surface words each kind of step: a clause that follows the refusal's own sentence.
Wording = Mapping[StepKind, Callable[[NextStep], str]]

# For a reader of no particular surface: what to do, naming no route and no command.
PLAIN_WORDING: Wording = {
    StepKind.RESOLVE_WRITE: lambda s: (
        f"check it, then resolve run {s.run} with what it returned (or that it did not happen)"
    ),
    StepKind.RESOLVE_THEN_FORK: lambda s: (
        f"resolve run {s.run} with what that write did first, then fork"
    ),
    StepKind.RESUME_RUN: lambda s: f"resuming run {s.run} finishes it",
    StepKind.REGISTER_AGENT: lambda s: "register its definition, then try again",
    StepKind.AWAIT_WAKE: lambda s: (
        f"it is not waiting on input and continues once {s.wake_at} passes, when it is woken"
    ),
    StepKind.DECLARE_CLIENT_TOOL: lambda s: (
        f"load the declaration of {s.tool!r} so the output can be checked, then resolve it"
    ),
}


class CodedError(Exception):
    """Base of every salvor error: one sentence, a stable code, an HTTP status.

    The store's and the daemon's errors derive from it too, so the one error
    envelope is rendered in one place. ``next_step``, when the refusal has a
    way out, is worded by whichever surface reports it (``sentence``).
    """

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(
        self, message: str, *, details: dict | None = None, next_step: NextStep | None = None
    ) -> None:
        if type(self) in _ABSTRACT:
            raise TypeError(f"raise a subclass of {type(self).__name__}, not the class itself")
        self.fault = message
        self.next_step = next_step
        self.message = self.sentence(PLAIN_WORDING)
        super().__init__(self.message)
        self.details = details

    @property
    def status(self) -> int:
        """The HTTP status of ``code``, from the one table."""
        return self.code.status

    def sentence(self, wording: Wording) -> str:
        """The one sentence, its next step (if any) in ``wording``'s words."""
        if self.next_step is None:
            return self.fault
        return f"{self.fault}; {wording[self.next_step.kind](self.next_step)}"

    def to_json(self, wording: Wording = PLAIN_WORDING) -> dict:
        """The one error envelope: ``{"error": {"code", "message", "details"?}}``, its
        message's next step in ``wording``'s words."""
        body: dict = {"code": str(self.code), "message": self.sentence(wording)}
        if self.details is not None:
            body["details"] = self.details
        return {"error": body}


class ProtocolError(CodedError):
    """Base of every pure-core error; raise a subclass, never this class."""


_ABSTRACT: set[type] = {CodedError, ProtocolError}


def abstract_error(cls: type) -> type:
    """Mark an error base class that must never be raised itself."""
    _ABSTRACT.add(cls)
    return cls


class MalformedEvent(ProtocolError):
    """Bytes or fields that do not form a well-typed event or envelope (the sender's fault)."""

    code = ErrorCode.BAD_REQUEST


class GuardRefusal(ProtocolError):
    """An event that is well formed but is not the one legal next event of its run."""

    code = ErrorCode.DIVERGENCE


class SchemaViolation(ProtocolError):
    """A value a recorded JSON schema (or the budget-extension shape) rejects."""

    code = ErrorCode.BAD_REQUEST

    def __init__(self, message: str, *, violations: list[dict] | None = None) -> None:
        super().__init__(message)
        self.violations = violations or []


class ReplayDivergence(ProtocolError):
    """A re-run asked for a call the recorded log does not hold at that position."""

    code = ErrorCode.DIVERGENCE
