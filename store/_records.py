"""What the store's reads return: run summaries, parked writes, stored agents and graphs, claims,
probe answers, outbox notifications, and the listing cursor, each built from a row.

A row whose JSON cannot be decoded gives a degraded summary, never an
exception: one bad run must not fail a listing.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from salvor.protocol import MalformedJson, RunView, excerpt, parse_strict

from ._errors import BadCursor
from ._view_codec import dumps

# The keys of a ``GET /v1/runs`` entry, in the order written, each with the field it is read
# from. ``to_json`` writes from this table; the OpenAPI document's ``RunSummary`` is checked
# against it when it is built.
SUMMARY_FIELDS: tuple[tuple[str, str], ...] = (
    ("run", "run_id"),
    ("status", "status"),
    ("event_count", "event_count"),
    ("first_recorded_at", "first_recorded_at"),
    ("last_recorded_at", "last_recorded_at"),
    ("usage", "usage"),
    ("step_count", "step_count"),
    ("agent_def_hash", "agent_def_hash"),
    ("graph_hash", "graph_hash"),
    ("labels", "labels"),
)
SUMMARY_KEYS = frozenset(key for key, _ in SUMMARY_FIELDS)
# Present in every entry, a degraded one too.
SUMMARY_REQUIRED = ("run", "event_count", "first_recorded_at", "last_recorded_at")


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
    graph_hash: str | None = None
    labels: dict | None = None
    driven_by: str | None = None
    wake_at: str | None = None
    pending: dict | None = None

    @property
    def degraded(self) -> bool:
        return self.status is None

    def to_json(self) -> dict:
        """The ``GET /v1/runs`` entry (``SUMMARY_FIELDS``): unknown values are absent keys, never
        null, and so are no labels."""
        body: dict = {}
        for key, name in SUMMARY_FIELDS:
            value = getattr(self, name)
            if value is not None and value != {}:
                body[key] = value
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedWrite:
    """A run in ``needs_reconciliation``: its view, whose ``pending`` is the write nobody
    knows the outcome of."""

    run_id: str
    view: RunView

    @property
    def parked_since(self) -> str:
        """When the write's intent was recorded."""
        return self.view.pending.recorded_at


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredAgent:
    """An agent definition as registered, verbatim."""

    agent_def_hash: str
    format: str
    definition: str
    name: str | None
    created_at: str
    # The file it was read from on the daemon's side; None: registered over the API or by a run.
    source_path: str | None = None


# The shape summary of a stored graph, as ``Graph.summary()`` gives it and a listing reports it.
GRAPH_SUMMARY_KEYS = ("node_count", "edge_count", "entry_nodes", "terminal_nodes")


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSummary:
    """A stored graph as a listing reports it: its hash and its shape, not its document."""

    graph_hash: str
    node_count: int
    edge_count: int
    entry_nodes: tuple[str, ...]
    terminal_nodes: tuple[str, ...]
    created_at: str

    def summary(self) -> dict:
        """The shape summary (``GRAPH_SUMMARY_KEYS``), as ``Graph.summary()`` gives it."""
        return {
            "node_count": self.node_count,
            "edge_count": self.edge_count,
            "entry_nodes": list(self.entry_nodes),
            "terminal_nodes": list(self.terminal_nodes),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredGraph:
    """A graph document as submitted (the parsed JSON value), under its hash."""

    graph_hash: str
    document: Any
    created_at: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """An idempotency identity and the one run (and intent seq) allowed to execute it."""

    identity: str
    run_id: str
    seq: int
    state: str  # "open" | "settled"
    output: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeAnswer:
    """The last probe of the open write at ``seq`` of ``run_id``: what it asked and was answered.

    ``answer`` is None when the probe gave none (``error`` says why);
    ``verdict`` is "landed", "not_landed" or "unknown".
    """

    run_id: str
    seq: int
    tool: str
    input: Any
    answer: Any
    error: str | None
    verdict: str
    observed_at: str


def probe_answer_from_row(row: Any) -> ProbeAnswer:
    return ProbeAnswer(
        run_id=row.run_id,
        seq=row.seq,
        tool=row.tool,
        input=json.loads(row.input),
        answer=loads_or_none(row.answer),
        error=row.error,
        verdict=row.verdict,
        observed_at=row.observed_at,
    )


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
        graph_hash=row.graph_hash,
        labels=labels,
        driven_by=row.driven_by,
        wake_at=row.wake_at,
        pending=pending,
    )


def encode_cursor(summary: RunSummary) -> str:
    return encode_position(summary.first_recorded_at, summary.run_id)


def encode_position(instant: str, run_id: str) -> str:
    """An opaque cursor for a listing ordered by an instant, then run id (``decode_cursor``)."""
    raw = dumps([instant, run_id]).encode()
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
        source_path=row.source_path,
    )


def claim_from_row(row: Any) -> Claim:
    return Claim(
        identity=row.identity,
        run_id=row.run_id,
        seq=row.seq,
        state=row.state,
        output=loads_or_none(row.output),
    )


def graph_summary_from_row(row: Any) -> GraphSummary:
    return GraphSummary(
        graph_hash=row.graph_hash,
        node_count=row.node_count,
        edge_count=row.edge_count,
        entry_nodes=tuple(json.loads(row.entry_nodes)),
        terminal_nodes=tuple(json.loads(row.terminal_nodes)),
        created_at=row.created_at,
    )


def graph_from_row(row: Any) -> StoredGraph:
    return StoredGraph(
        graph_hash=row.graph_hash, document=json.loads(row.document), created_at=row.created_at
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    """One row of the outbox: what the operator is to be told, and how its delivery went.

    ``body`` is the JSON text delivered byte for byte (a webhook's signature is over it).
    """

    id: int
    run_id: str
    seq: int
    kind: str
    body: str
    created_at: str
    attempts: int
    next_attempt_at: str
    delivered_at: str | None
    # The node delivering it now (or the one that delivered it), and until when its claim holds.
    claimed_by: str | None = None
    claimed_until: str | None = None


def notification_from_row(row: Any) -> Notification:
    return Notification(
        id=row.id,
        run_id=row.run_id,
        seq=row.seq,
        kind=row.kind,
        body=row.body,
        created_at=row.created_at,
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        delivered_at=row.delivered_at,
        claimed_by=row.claimed_by,
        claimed_until=row.claimed_until,
    )
