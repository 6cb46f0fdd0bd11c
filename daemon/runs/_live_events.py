"""What the event hub hands its subscribers: a published envelope with its encodings, a change
of a run's status for the run list, and the two kinds of subscriber that take them.

Each encoding (the SSE frame, the WebSocket message) is made on first use and kept on the event,
so a frame is encoded once however many streams carry it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from salvor.protocol import Envelope, RunView, encode_envelope, sse_frame


def event_frame(envelope: Envelope) -> bytes:
    """One server-sent event: the seq as its id, the pinned envelope as its data."""
    return sse_frame(encode_envelope(envelope), id=envelope.seq)


def event_message(envelope: Envelope) -> str:
    """The WebSocket ``event`` message: the envelope is byte for byte the SSE frame's data."""
    return f'{{"type":"event","run":{_json(envelope.run_id)},"event":{encode_envelope(envelope)}}}'


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class LiveEvent:
    """A durable envelope as published: the run's view after it, whether it changed the run's
    status, and its encodings, each worked out once for every subscriber."""

    __slots__ = ("_frame", "_message", "envelope", "extra", "status_changed", "view")

    def __init__(self, envelope: Envelope, view: RunView, *, status_changed: bool) -> None:
        self.envelope = envelope
        self.view = view
        self.status_changed = status_changed
        self._frame: bytes | None = None
        self._message: str | None = None
        # Encodings a transport derives from this event (a status message), by name.
        self.extra: dict[str, Any] = {}

    @property
    def frame(self) -> bytes:
        """The SSE frame (``event_frame``)."""
        if self._frame is None:
            self._frame = event_frame(self.envelope)
        return self._frame

    @property
    def weight(self) -> int:
        """About what a queued encoding of it weighs, in bytes (the envelope's JSON dominates)."""
        return len(self.frame)

    @property
    def message(self) -> str:
        """The WebSocket ``event`` message: the envelope is byte for byte the SSE frame's data."""
        if self._message is None:
            self._message = event_message(self.envelope)
        return self._message


class RunChange:
    """A run whose state or status a commit changed: its view after the commit. A watcher's
    encoding of it is made once (``encoded``) and shared."""

    __slots__ = ("_encoded", "run_id", "view")

    def __init__(self, view: RunView) -> None:
        self.run_id = view.run_id
        self.view = view
        self._encoded: str | None = None

    def encoded(self, encode: Callable[[RunView], str]) -> str:
        if self._encoded is None:
            self._encoded = encode(self.view)
        return self._encoded


class Listener(Protocol):
    """A subscriber of one run's events: takes each at once, or notes that it could not."""

    transport: str
    run_id: str

    def _offer(self, event: LiveEvent) -> None: ...


class Watcher(Protocol):
    """A subscriber of the run list: takes each change at once, or notes that it could not."""

    transport: str

    def _offer_change(self, change: RunChange) -> None: ...


def status_changed(before: RunView, after: RunView) -> bool:
    return before.state is not after.state or before.detail != after.detail
