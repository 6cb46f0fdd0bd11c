"""A version-6 store (one daemon per store) opened by this build gains what several nodes share:
the lease and session tables, the outbox's claim columns, the wake sweeper's tie-break."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from salvor.protocol import EMPTY_VIEW, RunFailed, RunStarted
from salvor.store import STORE_VERSION, EventStore, normalize_store_url
from sqlalchemy import create_engine, inspect, text

from tests.store.test_store import execute_sql


def test_a_version_7_store_gains_the_shared_node_state(store_url: str) -> None:
    with EventStore.open(store_url, notifications=True) as store:
        store.append("old", [RunStarted(agent_def_hash="sha256:a", input=1)], EMPTY_VIEW)
        store.append("old", [RunFailed(error="no")], store.read_view("old"))
    # Back to version 7's shape: no lease or session table, no claim, the one-column index.
    for statement in (
        "DROP TABLE client_leases",
        "DROP TABLE sessions",
        "ALTER TABLE notifications DROP COLUMN claimed_by",
        "ALTER TABLE notifications DROP COLUMN claimed_until",
        "DROP INDEX ix_runs_sleeping_wake_at",
        "CREATE INDEX ix_runs_sleeping_wake_at ON runs (wake_at) WHERE state = 'sleeping'",
        "UPDATE store_meta SET value = 7",
    ):
        execute_sql(store_url, statement)
    with EventStore.open(store_url, notifications=True) as store:
        # The row an older daemon wrote is claimed like any other.
        later = datetime.now(UTC) + timedelta(seconds=1)
        (row,) = store.outbox.claim_due("node", later, hold_seconds=60)
        assert (row.run_id, row.claimed_by) == ("old", "node")
        assert store.client_leases.current("old") is None and store.sessions.count() == 0
    engine = create_engine(normalize_store_url(store_url))
    with engine.connect() as connection:
        schema = inspect(connection)
        tables = {"client_leases", "sessions"} <= set(schema.get_table_names())
        indexes = {i["name"]: i["column_names"] for i in schema.get_indexes("runs")}
        version = connection.execute(text("SELECT value FROM store_meta")).scalar_one()
    engine.dispose()
    assert tables and indexes["ix_runs_sleeping_wake_at"] == ["wake_at", "run_id"]
    assert version == STORE_VERSION
