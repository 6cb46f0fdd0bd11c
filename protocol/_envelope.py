"""The envelope every recorded event travels in, and its pinned wire JSON.

The wire form is pinned: keys in the order ``run_id, seq, schema_version,
recorded_at, event{kind, payload}``, compact separators, UTF-8 without
escaping. The event stream, the log endpoints and ``salvor history --json``
emit these bytes and ``decode_envelope`` reads all of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ._errors import MalformedEvent, excerpt
from ._event_codec import Event
from ._events import EVENT_TYPES
from ._strict_json import MAX_NESTING, MalformedJson, parse_strict

SCHEMA_VERSION = 1
# The one default limit on a payload (issue 29, item 5): the largest event payload the store keeps
# and the largest request body the API reads (``salvor serve --max-payload-bytes`` sets both).
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
# An envelope holds a caller's value (itself at most MAX_NESTING deep) a few levels down:
# envelope, event, payload, field. Reading back what was written must not be refused.
ENVELOPE_NESTING = MAX_NESTING + 8

_ENVELOPE_KEYS = frozenset({"run_id", "seq", "schema_version", "recorded_at", "event"})
_EVENT_KEYS = frozenset({"kind", "payload"})
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """One recorded event at its position in its run's log."""

    run_id: str
    seq: int
    schema_version: int
    recorded_at: str
    event: Event

    @property
    def kind(self) -> str:
        return self.event.KIND

    def to_json(self) -> dict:
        """The envelope as a JSON object in pinned key order."""
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "schema_version": self.schema_version,
            "recorded_at": self.recorded_at,
            "event": {"kind": self.event.KIND.value, "payload": self.event.payload_at(self.seq)},
        }


def encode_payload(event: Event, *, seq: int) -> str:
    """The compact JSON text of an event's payload at position ``seq`` (what the store keeps)."""
    return _dumps(event.payload_at(seq))


def encode_envelope(envelope: Envelope) -> str:
    """The pinned wire JSON of an envelope."""
    return _dumps(envelope.to_json())


def decode_event(kind: Any, payload: Any, *, seq: int) -> Event:
    """Build the event recorded at position ``seq`` from its kind name and payload object.

    Raises:
        MalformedEvent: the kind is unknown, the payload does not fit it, or
            an intent's payload names a ``seq`` other than ``seq``.
    """
    event_type = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if event_type is None:
        raise MalformedEvent(
            f"unknown event kind {excerpt(kind)!r}"
            if isinstance(kind, str)
            else "an event kind must be a string"
        )
    return event_type.from_payload(payload, seq=seq)


def decode_envelope(data: str | bytes | dict) -> Envelope:
    """Read one envelope from its wire JSON (text, bytes or a parsed object).

    Raises:
        MalformedEvent: the JSON does not parse, a key is missing or unknown,
            a field has the wrong type, or the event kind is unknown. Nothing
            is ever dropped silently.
    """
    if isinstance(data, (str, bytes)):
        try:
            # What the daemon recorded, a model's or a tool's big integers included: read exactly.
            data = parse_strict(data, "the envelope", limit=ENVELOPE_NESTING, big_integers=True)
        except MalformedJson as exc:
            raise MalformedEvent(exc.message) from None
    if not isinstance(data, dict):
        raise MalformedEvent("an envelope must be a JSON object")
    if data.keys() != _ENVELOPE_KEYS:
        missing = sorted(_ENVELOPE_KEYS - data.keys())
        unknown = sorted(data.keys() - _ENVELOPE_KEYS)
        raise MalformedEvent(f"envelope keys are wrong (missing {missing}, unknown {unknown})")
    run_id, seq, version, recorded_at = (
        data["run_id"],
        data["seq"],
        data["schema_version"],
        data["recorded_at"],
    )
    if not isinstance(run_id, str) or not run_id:
        raise MalformedEvent("envelope `run_id` must be a non-empty string")
    if type(seq) is not int or seq < 0:
        raise MalformedEvent("envelope `seq` must be a non-negative integer")
    if type(version) is not int:
        raise MalformedEvent("envelope `schema_version` must be an integer")
    if version != SCHEMA_VERSION:
        raise MalformedEvent(
            f"envelope schema_version {version} is not supported "
            f"(this build reads {SCHEMA_VERSION})"
        )
    if not isinstance(recorded_at, str):
        raise MalformedEvent("envelope `recorded_at` must be a string")
    event = data["event"]
    if not isinstance(event, dict) or event.keys() != _EVENT_KEYS:
        raise MalformedEvent("envelope `event` must be an object with exactly `kind` and `payload`")
    return Envelope(
        run_id=run_id,
        seq=seq,
        schema_version=version,
        recorded_at=recorded_at,
        event=decode_event(event["kind"], event["payload"], seq=seq),
    )
