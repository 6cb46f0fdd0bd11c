"""The outbox's claims: each due row is taken by one claimer at a time, on both backends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from salvor.protocol import EMPTY_VIEW, RunFailed, RunStarted
from salvor.store import EventStore

from tests.store.test_store import execute_sql


@pytest.fixture
def outbox_store(store_url: str) -> Iterator[EventStore]:
    opened = EventStore.open(store_url, notifications=True)
    try:
        yield opened
    finally:
        opened.close()


def failed_runs(store: EventStore, count: int) -> None:
    """``count`` runs that failed: one due outbox row each."""
    for n in range(count):
        store.append(f"run-{n:03d}", [RunStarted(agent_def_hash="sha256:a", input=n)], EMPTY_VIEW)
        view = store.read_view(f"run-{n:03d}")
        store.append(f"run-{n:03d}", [RunFailed(error="no")], view)


def later() -> datetime:
    return datetime.now(UTC) + timedelta(seconds=1)


def test_two_claimers_take_disjoint_rows_and_a_lapsed_claim_frees_its_rows(
    outbox_store: EventStore, store_url: str
) -> None:
    failed_runs(outbox_store, 6)
    outbox = outbox_store.outbox
    first = outbox.claim_due("node-a", later(), hold_seconds=60, limit=4)
    second = outbox.claim_due("node-b", later(), hold_seconds=60, limit=4)
    assert [row.run_id for row in first] == ["run-000", "run-001", "run-002", "run-003"]
    assert [row.run_id for row in second] == ["run-004", "run-005"]
    assert {row.claimed_by for row in first} == {"node-a"}
    assert outbox.claim_due("node-c", later(), hold_seconds=60) == []
    # A claim that let its row go (a failed delivery) makes it due again for anyone.
    outbox.failed(first[0].id, datetime.now(UTC) - timedelta(seconds=1), node="node-a")
    assert [row.run_id for row in outbox.claim_due("node-c", later(), hold_seconds=60)] == [
        "run-000"
    ]
    # Another node's release does not touch a row it does not hold.
    outbox.failed(first[1].id, datetime.now(UTC), node="node-b")
    assert outbox.entries("run-001")[0].attempts == 0
    # node-b dies holding its rows: once its claim runs out (the store's clock is past it),
    # they are claimed again.
    execute_sql(
        store_url, "UPDATE notifications SET claimed_until = created_at WHERE claimed_by = 'node-b'"
    )
    retaken = outbox.claim_due("node-c", later(), hold_seconds=60)
    assert [row.run_id for row in retaken] == ["run-004", "run-005"]
    # Delivered rows are never claimed again, and the soonest due is a claim's end.
    for row in [*first[1:], *retaken]:
        outbox.mark_delivered(row.id)
    assert all(row.delivered_at for row in outbox.entries() if row.run_id != "run-000")
    assert outbox.next_due() is not None and outbox.next_due() > datetime.now(UTC)


def test_claimers_racing_on_threads_never_share_a_row(outbox_store: EventStore) -> None:
    failed_runs(outbox_store, 40)
    claimed: dict[str, list[int]] = {}
    start = threading.Barrier(4)

    def claim(node: str) -> None:
        start.wait()
        taken = []
        while batch := outbox_store.outbox.claim_due(node, later(), hold_seconds=60, limit=3):
            taken.extend(row.id for row in batch)
        claimed[node] = taken

    threads = [threading.Thread(target=claim, args=(f"node-{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    every = [row_id for taken in claimed.values() for row_id in taken]
    assert len(claimed) == 4
    assert sorted(every) == sorted(row.id for row in outbox_store.outbox.entries())
    assert len(every) == len(set(every)) == 40
