"""What recovery reads from the store on real databases: the runs due to wake, the interrupted ones,
and the runs parked on a write whose outcome is unknown.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    ModelCallRequested,
    RunAbandoned,
    RunCompleted,
    SleepStarted,
    ToolCallCompleted,
    ToolCallRequested,
    fold,
    format_instant,
)
from salvor.store import AppendRequest, BadCursor, EventStore
from sqlalchemy import text

from tests.support.store_records import execute_sql, started

# -- recovery queries -------------------------------------------------------------


def test_due_and_interrupted_runs(store: EventStore) -> None:
    now = datetime.now(UTC)
    past = (now - timedelta(minutes=5)).astimezone().isoformat()  # a local offset, not Z
    future = format_instant(now + timedelta(hours=1))

    def run(run_id: str, *batches, driven_by: str | None = None) -> None:
        _, view = store.append(run_id, [started(driven_by=driven_by)], EMPTY_VIEW)
        for batch in batches:
            _, view = store.append(run_id, batch, view)

    run("sleeps-past", [SleepStarted(wake_at=past)])
    run("sleeps-future", [SleepStarted(wake_at=future)])
    run("client-sleeps-past", [SleepStarted(wake_at=past)], driven_by="client")
    run("running")
    run("client-running", driven_by="client")
    run("awaiting-model", [ModelCallRequested(request_hash="sha256:a")])
    run(
        "awaiting-tool", [ToolCallRequested(tool="t", input=1, effect="read", idempotency_key=None)]
    )
    run(
        "parked-write", [ToolCallRequested(tool="t", input=1, effect="write", idempotency_key=None)]
    )
    run("done", [RunCompleted(output=None)])

    assert store.runs.due_runs(now) == ["sleeps-past"]
    assert store.runs.due_runs(now + timedelta(hours=2)) == ["sleeps-past", "sleeps-future"]
    assert store.runs.due_runs(now - timedelta(hours=1)) == []
    assert sorted(store.runs.interrupted_runs()) == ["awaiting-model", "awaiting-tool", "running"]


def write(tool: str = "refund", key: str | None = None) -> ToolCallRequested:
    return ToolCallRequested(tool=tool, input={"invoice": 1}, effect="write", idempotency_key=key)


def test_parked_writes_lists_only_runs_on_an_unknown_write_oldest_first(
    store: EventStore, store_url: str
) -> None:
    views = {}
    for run_id in ("p-late", "p-early", "p-tie-b", "p-tie-a", "read", "settled", "gone"):
        _, views[run_id] = store.append(run_id, [started({"who": run_id})], EMPTY_VIEW)
    for run_id in ("p-early", "settled", "read", "gone"):
        tool = "lookup" if run_id == "read" else "refund"
        batch = (
            [write(tool, key="k")]
            if tool == "refund"
            else [ToolCallRequested(tool=tool, input=1, effect="read", idempotency_key=None)]
        )
        _, views[run_id] = store.append(run_id, batch, views[run_id])
    results = store.append_batch(
        [AppendRequest(run_id=r, events=[write()], view=views[r]) for r in ("p-tie-b", "p-tie-a")]
    )
    for run_id, (_, view) in zip(("p-tie-b", "p-tie-a"), results, strict=True):
        views[run_id] = view
    _, views["p-late"] = store.append("p-late", [write(key="late")], views["p-late"])
    store.append("settled", [ToolCallCompleted(seq=1, output=1)], views["settled"])
    abandon = RunAbandoned(unresolved_write={"seq": 1, "tool": "refund"})
    store.append("gone", [abandon], views["gone"])

    page, cursor = store.runs.parked_writes()
    assert cursor is None
    assert [p.run_id for p in page] == ["p-early", "p-tie-b", "p-tie-a", "p-late"]
    for parked in page:
        assert parked.view == store.read_view(parked.run_id)
        assert parked.parked_since == store.read_log(parked.run_id)[-1].recorded_at
    assert page[3].view.pending.idempotency_key == "late"
    assert page[0].view.labels == {"who": "p-early"}

    seen, cursor = [], None
    while True:
        one, cursor = store.runs.parked_writes(limit=1, after=cursor)
        seen += [p.run_id for p in one]
        if cursor is None:
            break
    assert seen == [p.run_id for p in page]
    two, cursor = store.runs.parked_writes(limit=2)
    rest, end = store.runs.parked_writes(limit=2, after=cursor)
    assert [p.run_id for p in two + rest] == seen and end is None
    with pytest.raises(BadCursor):
        store.runs.parked_writes(after="not-a-cursor")

    # Two intents recorded at the same instant: the run id breaks the tie.
    execute_sql(
        store_url,
        "UPDATE runs SET last_recorded_at = :at WHERE run_id IN ('p-tie-a', 'p-tie-b')",
        at=page[1].parked_since,
    )
    tied = [p.run_id for p in store.runs.parked_writes()[0]]
    assert tied == ["p-early", "p-tie-a", "p-tie-b", "p-late"]

    # A row whose view cannot be decoded still lists, from its log.
    execute_sql(store_url, "UPDATE runs SET view = '{' WHERE run_id = 'p-late'")
    assert store.runs.parked_writes()[0][-1].view == fold(store.read_log("p-late"))


def test_the_parked_writes_query_reads_its_partial_index(store: EventStore) -> None:
    if store.dialect != "sqlite":
        pytest.skip("the plan is read from SQLite's EXPLAIN QUERY PLAN")
    from salvor.store._run_reads import _PARKED_WRITES

    query = str(_PARKED_WRITES.compile(compile_kwargs={"literal_binds": True}))
    with store._reader.connect() as connection:
        plan = connection.execute(text("EXPLAIN QUERY PLAN " + query)).all()
    details = " ".join(row[-1] for row in plan)
    assert "ix_runs_unreconciled" in details and "TEMP B-TREE" not in details
