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
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


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
