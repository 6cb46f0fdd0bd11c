"""The replay cursor: answers a re-run's calls from the recorded log, in order.

A driver re-runs its deterministic loop from the start of the log; every call
it would make goes through the cursor first. While the log still has events,
the cursor hands back what was recorded (and refuses a call the log does not
hold at that position); once the log is exhausted the driver goes live and
records. A completed call is never executed again, because the cursor
answers it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._canonical import canonical_json
from ._envelope import Envelope
from ._errors import ReplayDivergence
from ._events import EventKind, ModelCallRequested, ToolCallRequested


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """A call found in the log: its intent, and its completion when it has one."""

    intent: Envelope
    completion: Envelope | None

    @property
    def seq(self) -> int:
        return self.intent.seq


_COMPLETION = {
    EventKind.MODEL_CALL_REQUESTED: EventKind.MODEL_CALL_COMPLETED,
    EventKind.TOOL_CALL_REQUESTED: EventKind.TOOL_CALL_COMPLETED,
}


class ReplayCursor:
    """Walks a recorded log in the order a deterministic driver asks for it."""

    def __init__(self, log: Sequence[Envelope]) -> None:
        self._log = log
        self.position = 0

    @property
    def at_end(self) -> bool:
        """True once every recorded event has been consumed: the driver is live."""
        return self.position >= len(self._log)

    def _peek(self) -> Envelope | None:
        return None if self.at_end else self._log[self.position]

    def _diverge(self, asked: str, found: Envelope) -> ReplayDivergence:
        return ReplayDivergence(
            f"replay diverged at seq {found.seq}: the run asked for {asked} "
            f"but the log records {found.kind}"
        )

    def _call(self, kind: EventKind, asked: str) -> RecordedCall | None:
        intent = self._peek()
        if intent is None:
            return None
        if intent.event.KIND is not kind:
            raise self._diverge(asked, intent)
        self.position += 1
        completion = self._peek()
        # An intent may also be followed by RunFailed or RunAbandoned: that
        # call never completed, and the terminal event is left for the driver.
        if completion is None or completion.event.KIND is not _COMPLETION[kind]:
            return RecordedCall(intent, None)
        self.position += 1
        return RecordedCall(intent, completion)

    def model_call(self, request_hash: str) -> RecordedCall | None:
        """The recorded model call at this position, or None when live.

        Raises:
            ReplayDivergence: the log holds another kind here, or a model call
                whose request hash differs (the request was not rebuilt
                identically: a changed definition or a non-deterministic loop).
        """
        recorded = self._call(EventKind.MODEL_CALL_REQUESTED, "a model call")
        if recorded is not None:
            event: ModelCallRequested = recorded.intent.event  # type: ignore[assignment]
            if event.request_hash != request_hash:
                self.position = recorded.intent.seq
                raise ReplayDivergence(
                    f"replay diverged at seq {recorded.seq}: model call request_hash "
                    f"{request_hash} differs from the recorded {event.request_hash}"
                )
        return recorded

    def tool_call(self, tool: str, tool_input: Any) -> RecordedCall | None:
        """The recorded tool call at this position, or None when live.

        Raises:
            ReplayDivergence: the log holds another kind here, or a call of
                another tool or with other input.
        """
        recorded = self._call(EventKind.TOOL_CALL_REQUESTED, f"tool call {tool!r}")
        if recorded is not None:
            event: ToolCallRequested = recorded.intent.event  # type: ignore[assignment]
            if event.tool != tool or canonical_json(event.input) != canonical_json(tool_input):
                self.position = recorded.intent.seq
                raise ReplayDivergence(
                    f"replay diverged at seq {recorded.seq}: the run asked for tool call "
                    f"{tool!r} with input {canonical_json(tool_input).decode()} but the log "
                    f"records {event.tool!r} with input {canonical_json(event.input).decode()}"
                )
        return recorded

    def take(self, kind: EventKind) -> Envelope | None:
        """Consume the next event if it is ``kind``; None when live.

        Raises:
            ReplayDivergence: the log holds another kind at this position.
        """
        found = self._peek()
        if found is None:
            return None
        if found.event.KIND is not kind:
            raise self._diverge(kind.value, found)
        self.position += 1
        return found

    def take_if(self, kind: EventKind) -> Envelope | None:
        """Consume the next event only when it is ``kind``; otherwise leave the cursor alone."""
        found = self._peek()
        if found is None or found.event.KIND is not kind:
            return None
        self.position += 1
        return found
