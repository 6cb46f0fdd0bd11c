"""The tool registry: named tools with declared effects, and what a tool may return.

A tool's effect decides what happens when its call is found open after a
crash: ``read`` and ``idempotent`` calls are executed again (an idempotent
one under its recorded key), a ``write`` parks the run for a person.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import trio
from salvor.protocol import Effect


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """What a tool handler is told about the call it is executing."""

    run_id: str
    seq: int
    idempotency_key: str | None
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspend:
    """Outcome: park the run until something resumes it with an input ``input_schema`` accepts."""

    reason: str
    input_schema: dict
    kind: str | None = None  # "signal" when an external system, not a person, owes the input


@dataclass(frozen=True, slots=True, kw_only=True)
class SleepUntil:
    """Outcome: park the run on a durable timer until ``wake_at``."""

    wake_at: datetime


class ToolFailed(Exception):
    """A tool refused or failed; ``retryable`` says whether trying again could help."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class OutcomeUnknown(Exception):
    """A write was sent and no answer came back: it may or may not have happened.

    The runtime never guesses: the call's intent stays open, which parks the
    run in needs_reconciliation until a person records what happened. (A read
    or an idempotent call raising it is retried like a ``ToolFailed``.)
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotPerformed(Exception):
    """The handler could not perform the call now, and nothing of it happened.

    The runtime leaves the call's intent open and ends the drive; the next
    drive performs it again. Only for calls without an effect to fear (a
    read): an open write intent is needs_reconciliation whatever the reason.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


Handler = Callable[[Any, ToolCall], Awaitable[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    name: str
    description: str
    effect: Effect
    input_schema: dict
    handler: Handler

    def spec(self) -> dict:
        """The tool as the model sees it."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


# Attempts per effect class: a read or an idempotent call can be retried
# safely; a write is tried once, since a failure may hide a landed effect.
ATTEMPTS = {Effect.READ: 3, Effect.IDEMPOTENT: 3, Effect.WRITE: 1}


class ToolRegistry:
    """The named tools a daemon can execute."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools or ():
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)


class DispatchFailed(Exception):
    """Every attempt a tool's effect allows failed; ``message`` is the last failure."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts


async def dispatch(
    tool: Tool, tool_input: Any, *, run_id: str, seq: int, key: str | None
) -> tuple[Any, int]:
    """Run a tool's handler, retried as its effect allows; the outcome and the attempt that gave it.

    A read or idempotent tool is tried up to three times (an idempotent one
    under the same key every time); a write once, since its failure may
    hide a landed effect.

    Raises:
        DispatchFailed: the last attempt failed (or a failure said retrying cannot help).
        OutcomeUnknown: a write's handler sent it and got no answer.
        NotPerformed: the handler could not perform the call now.
    """
    attempts = ATTEMPTS[tool.effect]
    for attempt in range(1, attempts + 1):
        try:
            outcome = await tool.handler(
                tool_input, ToolCall(run_id=run_id, seq=seq, idempotency_key=key, attempt=attempt)
            )
        except NotPerformed:
            raise
        except OutcomeUnknown as exc:
            if tool.effect is Effect.WRITE:
                raise  # the caller leaves the intent open: never guessed, never retried
            if attempt == attempts:
                raise DispatchFailed(exc.message, attempt) from None
        except ToolFailed as exc:
            if not exc.retryable or attempt == attempts:
                raise DispatchFailed(exc.message, attempt) from None
        except Exception as exc:  # noqa: BLE001 -- a tool's own bug is its failure, never a crash of the caller
            if attempt == attempts:
                raise DispatchFailed(f"{type(exc).__name__}: {exc}", attempt) from None
        else:
            return outcome, attempt
        await trio.sleep(min(0.05 * 2**attempt, 1.0))
    raise AssertionError("unreachable: the last attempt always returns or raises")
