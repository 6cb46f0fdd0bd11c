"""The base of every recorded event: its payload, written and read by the rules ``_events``
states (strict fields, optional ones absent when unset, keys in declaration order, an intent's
position on the wire only).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ._errors import excerpt
from ._event_checks import check_seq, malformed
from ._event_kinds import EventKind


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every recorded event; subclasses name their ``kind``."""

    KIND: ClassVar[EventKind]
    # Names of fields that are omitted from the payload when None.
    optional: ClassVar[frozenset[str]] = frozenset()
    # Whether the payload on the wire carries the event's own position as `seq`.
    positioned: ClassVar[bool] = False

    def to_payload(self) -> dict:
        """The payload object, optional fields omitted when unset."""
        payload = {}
        for name in self._field_names():
            value = getattr(self, name)
            if value is None and name in self.optional:
                continue
            payload[name] = value
        return payload

    def payload_at(self, seq: int) -> dict:
        """The payload as written at position ``seq``: an intent's names that position first."""
        if not self.positioned:
            return self.to_payload()
        return {"seq": seq, **self.to_payload()}

    @classmethod
    def _field_names(cls) -> tuple[str, ...]:
        cached = _FIELD_NAMES.get(cls)
        if cached is None:
            cached = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
        return cached

    @classmethod
    def from_payload(cls, payload: Any, *, seq: int) -> Event:
        """Build the event recorded at position ``seq`` from its payload object.

        Raises:
            MalformedEvent: the payload is not an object, has an unknown or
                missing field, carries an optional field as ``null``, a field
                has the wrong type, or an intent's ``seq`` is not ``seq``.
        """
        if not isinstance(payload, dict):
            raise malformed(cls.KIND, "payload must be an object")
        if cls.positioned and "seq" in payload:
            check_seq(cls.KIND, "seq", payload["seq"])
            if payload["seq"] != seq:
                raise malformed(
                    cls.KIND, f"payload `seq` {payload['seq']} is not the event's position {seq}"
                )
            payload = payload.copy()  # the caller's object stays as it was sent
            del payload["seq"]
        names = cls._field_names()
        for key in payload:
            if key not in names:
                raise malformed(cls.KIND, f"unknown payload field `{excerpt(key)}`")
        for name in names:
            if name not in payload:
                if name not in cls.optional:
                    raise malformed(cls.KIND, f"payload is missing `{name}`")
            elif payload[name] is None and name in cls.optional:
                raise malformed(cls.KIND, f"`{name}` is absent when unset, never null")
        return cls(**payload)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
