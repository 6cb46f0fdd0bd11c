"""The reads every node makes over and over stay one indexed read however many nodes share the
store (issue 30, item 3): the wake sweeper's due runs and the outbox's claimable rows.

SQLite's ``EXPLAIN QUERY PLAN`` is read (PostgreSQL's planner picks a scan on tables this small).
"""

from __future__ import annotations

import pytest
from salvor.store import EventStore
from sqlalchemy import text

from tests.support.backends import SQLITE_ONLY

STORE_BACKENDS = SQLITE_ONLY


def plan(store: EventStore, statement, **params) -> str:
    compiled = statement.compile(dialect=store._engine.dialect)
    values = {**compiled.params, **params}
    ordered = tuple(values[name] for name in compiled.positiontup)
    with store._reader.connect() as connection:
        rows = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", ordered).all()
    return " ".join(row[-1] for row in rows)


def test_the_wake_sweepers_due_runs_are_read_from_their_partial_index(store: EventStore) -> None:
    from salvor.store._run_reads import _DUE_RUNS

    details = plan(store, _DUE_RUNS, now="2026-12-06T00:00:00.000000Z")
    assert "ix_runs_sleeping_wake_at" in details and "TEMP B-TREE" not in details, details


def test_the_outboxs_claimable_rows_are_read_from_its_partial_index(store: EventStore) -> None:
    details = plan(store, store.outbox._claimable, now="2026-12-06T00:00:00.000000Z", limit=50)
    assert "ix_notifications_due" in details and "TEMP B-TREE" not in details, details


@pytest.mark.parametrize("table", ["client_leases", "sessions"])
def test_a_lease_or_a_session_is_found_by_its_key(store: EventStore, table: str) -> None:
    key = "run_id" if table == "client_leases" else "id_digest"
    with store._reader.connect() as connection:
        rows = connection.execute(
            text(f"EXPLAIN QUERY PLAN SELECT * FROM {table} WHERE {key} = 'x'")
        ).all()
    details = " ".join(row[-1] for row in rows)
    assert "USING INDEX" in details or "PRIMARY KEY" in details, details
