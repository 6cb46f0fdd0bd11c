"""What the store's tests write and check with: a run's head, a keyed call, a stored graph, a
write behind the store's back, and the check that a runs row is the fold of its log."""

from __future__ import annotations

from salvor.protocol import (
    RunStarted,
    ToolCallRequested,
    fold,
)
from salvor.store import (
    EventStore,
    RunSummary,
    normalize_store_url,
)
from sqlalchemy import create_engine, text

USAGE = {"input_tokens": 10, "output_tokens": 3}


def started(labels: dict | None = None, driven_by: str | None = None) -> RunStarted:
    return RunStarted(
        agent_def_hash="sha256:agent", input={"task": "refund"}, labels=labels, driven_by=driven_by
    )


def execute_sql(store_url: str, statement: str, **params: object) -> None:
    """Write behind the store's back (to corrupt or age it), through a plain engine."""
    engine = create_engine(normalize_store_url(store_url))
    try:
        with engine.begin() as connection:
            connection.execute(text(statement), params)
    finally:
        engine.dispose()


def run_summary(store: EventStore, run_id: str) -> RunSummary | None:
    """The run's entry in the listing, or None when the run has no events."""
    summaries, _ = store.list_runs()
    return next((summary for summary in summaries if summary.run_id == run_id), None)


def assert_row_matches_log(store: EventStore, run_id: str) -> None:
    log = store.read_log(run_id)
    folded = fold(log)
    assert store.read_view(run_id) == folded
    summary = run_summary(store, run_id)
    assert summary is not None
    assert summary.status == folded.status()
    assert summary.state == folded.state.value
    assert summary.usage == folded.usage()
    assert summary.step_count == folded.step_count
    assert summary.event_count == folded.next_seq == len(log)
    assert summary.first_recorded_at == folded.first_recorded_at
    assert summary.last_recorded_at == folded.last_recorded_at
    assert summary.labels == folded.labels
    assert summary.driven_by == folded.driven_by
    assert summary.agent_def_hash == folded.agent_def_hash
    assert summary.pending == (folded.pending.to_json() if folded.pending else None)


def pay(key: str) -> ToolCallRequested:
    return ToolCallRequested(
        tool="pay", input={"claim": key}, effect="idempotent", idempotency_key=key
    )


GRAPH_DOCUMENT = {
    # Keys out of canonical order: the store must keep the order they came in.
    "schema_version": 1,
    "nodes": [{"kind": "tool", "id": "look", "tool": "lookup"}, {"id": "tell", "kind": "delay"}],
    "edges": [{"to": "tell", "from": "look"}],
}
GRAPH_SUMMARY = {
    "node_count": 2,
    "edge_count": 1,
    "entry_nodes": ["look"],
    "terminal_nodes": ["tell"],
}
