"""What the store's reads return: run summaries, stored agents, claims, and the
listing cursor, each built from a row.

A row whose JSON cannot be decoded gives a degraded summary, never an
exception: one bad run must not fail a listing.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from salvor.protocol import MalformedJson, excerpt, parse_strict

from ._errors import BadCursor
from ._view_codec import dumps


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """One run as a listing reports it, read from its ``runs`` row.

    Every field but ``run_id``, ``event_count`` and the two instants is None
    when the row's JSON cannot be decoded: that run's entry is degraded, the
    listing is not failed.
    """

    run_id: str
    event_count: int
    first_recorded_at: str
    last_recorded_at: str
    status: dict | None = None
    state: str | None = None
    usage: dict | None = None
    step_count: int | None = None
    agent_def_hash: str | None = None
    labels: dict | None = None
    driven_by: str | None = None
    wake_at: str | None = None
    pending: dict | None = None

    @property
    def degraded(self) -> bool:
        return self.status is None

    def to_json(self) -> dict:
        """The ``GET /v1/runs`` entry: unknown values are absent keys, never null."""
        body: dict = {"run": self.run_id}
        if self.status is not None:
            body["status"] = self.status
        body["event_count"] = self.event_count
        body["first_recorded_at"] = self.first_recorded_at
        body["last_recorded_at"] = self.last_recorded_at
        if self.usage is not None:
            body["usage"] = self.usage
        if self.step_count is not None:
            body["step_count"] = self.step_count
        if self.agent_def_hash is not None:
            body["agent_def_hash"] = self.agent_def_hash
        if self.labels:
            body["labels"] = self.labels
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredAgent:
    """An agent definition as registered, verbatim."""

    agent_def_hash: str
    format: str
    definition: str
    name: str | None
    created_at: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """An idempotency identity and the one run (and intent seq) allowed to execute it."""

    identity: str
    run_id: str
    seq: int
    state: str  # "open" | "settled"
    output: Any


def loads_or_none(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def summary_from_row(row: Any) -> RunSummary:
    try:
        status = json.loads(row.status)
        labels = loads_or_none(row.labels)
        pending = loads_or_none(row.pending)
        if not isinstance(status, dict) or not isinstance(labels, dict | None):
            raise TypeError("status must be an object and labels an object or absent")
        if not isinstance(pending, dict | None):
            raise TypeError("pending must be an object or absent")
    except (ValueError, TypeError):
        # Only the plain columns survive: this run's entry is degraded.
        return RunSummary(
            run_id=row.run_id,
            event_count=row.event_count,
            first_recorded_at=row.first_recorded_at,
            last_recorded_at=row.last_recorded_at,
        )
    return RunSummary(
        run_id=row.run_id,
        event_count=row.event_count,
        first_recorded_at=row.first_recorded_at,
        last_recorded_at=row.last_recorded_at,
        status=status,
        state=row.state,
        usage={"input_tokens": row.input_tokens, "output_tokens": row.output_tokens},
        step_count=row.step_count,
        agent_def_hash=row.agent_def_hash,
        labels=labels,
        driven_by=row.driven_by,
        wake_at=row.wake_at,
        pending=pending,
    )


def encode_cursor(summary: RunSummary) -> str:
    raw = dumps([summary.first_recorded_at, summary.run_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        # A caller sends it back: parsed strictly, so no crafted cursor can
        # nest deep enough to crash a parse.
        first, run_id = parse_strict(raw, "the cursor")
        if not isinstance(first, str) or not isinstance(run_id, str):
            raise TypeError(cursor)
    except (MalformedJson, ValueError, TypeError, binascii.Error):
        raise BadCursor(
            f"the listing cursor {excerpt(cursor)!r} is not one this store issued"
        ) from None
    return first, run_id


def agent_from_row(row: Any) -> StoredAgent:
    return StoredAgent(
        agent_def_hash=row.agent_def_hash,
        format=row.format,
        definition=row.definition,
        name=row.name,
        created_at=row.created_at,
    )


def claim_from_row(row: Any) -> Claim:
    return Claim(
        identity=row.identity,
        run_id=row.run_id,
        seq=row.seq,
        state=row.state,
        output=loads_or_none(row.output),
    )
