"""Where the store lives and how it opens: its URL, the upgrades of every older schema version,
the refusals (a newer store, an in-memory SQLite, an unwritable path, an unreachable server),
SQLite's WAL mode, the store's public names, and an append surviving a dropped connection.
"""

from __future__ import annotations

import json
import time

import pytest
import salvor.store
from salvor.protocol import (
    EMPTY_VIEW,
    ModelCallRequested,
)
from salvor.store import (
    STORE_VERSION,
    EventStore,
    SeqConflict,
    StoreError,
    StoreTooNew,
    StoreUnavailable,
    default_store_url,
    normalize_store_url,
)
from sqlalchemy import create_engine, inspect, text

from tests.support.store_records import (
    GRAPH_DOCUMENT,
    GRAPH_SUMMARY,
    execute_sql,
    pay,
    started,
)

# -- where the store lives ----------------------------------------------------------


def test_default_store_url() -> None:
    assert default_store_url({"SALVOR_STORE": "/srv/x.db"}) == "sqlite:////srv/x.db"
    assert default_store_url({"SALVOR_STORE": "postgres://u@h/db"}) == "postgresql+psycopg://u@h/db"
    assert (
        default_store_url({"STATE_DIRECTORY": "/var/lib/salvor:/var/lib/other", "HOME": "/h"})
        == "sqlite:////var/lib/salvor/salvor.db"
    )
    assert (
        default_store_url({"XDG_STATE_HOME": "/x/state", "HOME": "/h"})
        == "sqlite:////x/state/salvor/salvor.db"
    )
    assert default_store_url({"HOME": "/h"}) == "sqlite:////h/.local/state/salvor/salvor.db"


def test_normalize_store_url(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert normalize_store_url("runs.db") == f"sqlite:///{tmp_path}/runs.db"
    assert normalize_store_url("sqlite:////a/b.db") == "sqlite:////a/b.db"
    assert normalize_store_url("postgresql://h/db") == "postgresql+psycopg://h/db"
    assert normalize_store_url("postgresql+psycopg://h/db") == "postgresql+psycopg://h/db"
    with pytest.raises(StoreUnavailable, match="mysql"):
        normalize_store_url("mysql://h/db")


# -- opening --------------------------------------------------------------------------


def test_opening_an_older_store_upgrades_it(store_url: str) -> None:
    EventStore.open(store_url).close()
    execute_sql(store_url, "UPDATE store_meta SET value = 0")
    execute_sql(store_url, "DROP TABLE claims")
    with EventStore.open(store_url) as store:
        _, view = store.append("a", [started()], EMPTY_VIEW)
        store.append("a", [pay("k")], view, claim="pay:k")
        assert store.claims.get_claim("pay:k").run_id == "a"
    engine = create_engine(normalize_store_url(store_url))
    with engine.connect() as connection:
        assert (
            connection.execute(text("SELECT value FROM store_meta")).scalar_one() == STORE_VERSION
        )
    engine.dispose()


def test_a_version_1_store_gains_replay_of_in_every_stored_view(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        _, view = store.append("a", [started()], EMPTY_VIEW)
        store.append("a", [pay("k")], view)
        store.append("b", [started(labels={"team": "x"})], EMPTY_VIEW)
        before = {run: store.read_view(run) for run in ("a", "b")}
    # What version 1 stored: the same views without the field.
    engine = create_engine(normalize_store_url(store_url))
    with engine.begin() as connection:
        for run_id, stored in connection.execute(text("SELECT run_id, view FROM runs")).all():
            old = json.loads(stored)
            del old["replay_of"]
            connection.execute(
                text("UPDATE runs SET view = :v WHERE run_id = :r"),
                {"v": json.dumps(old), "r": run_id},
            )
        connection.execute(text("UPDATE store_meta SET value = 1"))
    engine.dispose()
    with EventStore.open(store_url) as store:
        assert {run: store.read_view(run) for run in ("a", "b")} == before
        assert all(store.read_view(run).replay_of is None for run in ("a", "b"))
    # The rows themselves were patched (a read would otherwise fall back to the log).
    engine = create_engine(normalize_store_url(store_url))
    with engine.connect() as connection:
        views = [json.loads(v) for (v,) in connection.execute(text("SELECT view FROM runs")).all()]
    engine.dispose()
    assert all(view["replay_of"] is None for view in views) and len(views) == 2


def test_a_version_2_store_gains_the_reconciliation_index(store_url: str) -> None:
    EventStore.open(store_url).close()
    execute_sql(store_url, "DROP INDEX ix_runs_unreconciled")
    execute_sql(store_url, "UPDATE store_meta SET value = 2")
    EventStore.open(store_url).close()
    engine = create_engine(normalize_store_url(store_url))
    with engine.connect() as connection:
        names = {index["name"] for index in inspect(connection).get_indexes("runs")}
        version = connection.execute(text("SELECT value FROM store_meta")).scalar_one()
    engine.dispose()
    assert "ix_runs_unreconciled" in names and version == STORE_VERSION


# The state each partial index of the runs table covers, and the one that covers every row.
PARTIAL_INDEXES = {
    "ix_runs_active": "awaiting_tool",
    "ix_runs_sleeping_wake_at": "sleeping",
    "ix_runs_unreconciled": "needs_reconciliation",
}


def _runs_indexes(store_url: str) -> dict[str, str]:
    """Each index of the runs table as its database wrote it down."""
    engine = create_engine(normalize_store_url(store_url))
    if engine.dialect.name == "sqlite":
        query = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'"
    else:
        query = (
            "SELECT indexname, indexdef FROM pg_indexes"
            " WHERE tablename = 'runs' AND schemaname = current_schema()"
        )
    with engine.connect() as connection:
        indexes = {name: sql or "" for name, sql in connection.execute(text(query)).all()}
    engine.dispose()
    return indexes


def test_the_state_indexes_are_partial_on_either_database_created_or_upgraded(
    store_url: str,
) -> None:
    # PostgreSQL's clause is attached as each index is created (store/_schema._partial_index), so
    # both ways an index comes to be are checked: a new store, and an upgrade that adds one.
    EventStore.open(store_url).close()
    created = _runs_indexes(store_url)
    execute_sql(store_url, "DROP INDEX ix_runs_unreconciled")
    execute_sql(store_url, "UPDATE store_meta SET value = 2")
    EventStore.open(store_url).close()
    upgraded = _runs_indexes(store_url)
    for indexes in (created, upgraded):
        for name, state in PARTIAL_INDEXES.items():
            assert " WHERE " in indexes[name].upper() and state in indexes[name], indexes[name]
        assert " WHERE " not in indexes["ix_runs_listing"].upper()


def test_a_version_3_store_gains_the_probe_answers_table(store_url: str) -> None:
    EventStore.open(store_url).close()
    execute_sql(store_url, "DROP TABLE probe_answers")
    execute_sql(store_url, "UPDATE store_meta SET value = 3")
    with EventStore.open(store_url) as store:
        store.claims.put_probe_answer(
            "a", 3, tool="look", probe_input={}, answer=None, error="x", verdict="unknown"
        )
        assert store.claims.probe_answers([("a", 3)])[("a", 3)].error == "x"


def test_a_version_4_store_learns_graph_runs(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        _, view = store.append("a", [started()], EMPTY_VIEW)
        store.append("a", [pay("k")], view)
        before = store.read_view("a")
    # What version 4 stored: no graph_hash column, views without the graph fields.
    engine = create_engine(normalize_store_url(store_url))
    with engine.begin() as connection:
        (stored,) = connection.execute(text("SELECT view FROM runs")).one()
        old = {k: v for k, v in json.loads(stored).items() if k not in GRAPH_FIELDS}
        connection.execute(text("UPDATE runs SET view = :v"), {"v": json.dumps(old)})
        connection.execute(text("DROP INDEX ix_runs_forked_from"))
        connection.execute(text("ALTER TABLE runs DROP COLUMN graph_hash"))
        connection.execute(text("ALTER TABLE runs DROP COLUMN forked_from"))
        connection.execute(text("UPDATE store_meta SET value = 4"))
    engine.dispose()
    with EventStore.open(store_url) as store:
        assert store.read_view("a") == before
        (summary,), _ = store.list_runs()
        assert summary.graph_hash is None and summary.agent_def_hash is not None
    engine = create_engine(normalize_store_url(store_url))
    with engine.connect() as connection:
        (stored,) = connection.execute(text("SELECT view FROM runs")).one()
        indexes = {index["name"] for index in inspect(connection).get_indexes("runs")}
    engine.dispose()
    assert {k: json.loads(stored)[k] for k in GRAPH_FIELDS} == dict.fromkeys(GRAPH_FIELDS)
    assert "ix_runs_forked_from" in indexes


GRAPH_FIELDS = ("graph_hash", "forked_from", "open_node")


def test_a_version_4_store_gains_the_graphs_table(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        store.append("a", [started()], EMPTY_VIEW)
    execute_sql(store_url, "DROP TABLE graphs")
    execute_sql(store_url, "UPDATE store_meta SET value = 4")
    with EventStore.open(store_url) as store:
        assert store.definitions.put_graph(
            "sha256:g1", document=GRAPH_DOCUMENT, summary=GRAPH_SUMMARY
        )
        assert store.definitions.get_graph("sha256:g1").document == GRAPH_DOCUMENT
        # What the older store held is untouched.
        assert store.read_view("a").next_seq == 1
    engine = create_engine(normalize_store_url(store_url))
    with engine.connect() as connection:
        version = connection.execute(text("SELECT value FROM store_meta")).scalar_one()
    engine.dispose()
    assert version == STORE_VERSION


def test_opening_a_newer_store_is_refused(store_url: str) -> None:
    EventStore.open(store_url).close()
    execute_sql(store_url, "UPDATE store_meta SET value = :v", v=STORE_VERSION + 1)
    with pytest.raises(StoreTooNew) as caught:
        EventStore.open(store_url)
    message = caught.value.message
    assert str(STORE_VERSION + 1) in message and str(STORE_VERSION) in message
    assert "upgrade salvor" in message


def test_an_unwritable_path_is_unavailable() -> None:
    with pytest.raises(StoreUnavailable, match="/proc/x"):
        EventStore.open("/proc/x/salvor.db")


def test_an_in_memory_sqlite_store_is_refused() -> None:
    with pytest.raises(StoreUnavailable, match="in-memory"):
        EventStore.open("sqlite://")


def test_an_unreachable_postgres_is_unavailable_quickly() -> None:
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        EventStore.open("postgresql://salvor:secret@127.0.0.1:1/salvor?connect_timeout=2")
    assert time.monotonic() - began < 5
    assert "127.0.0.1:1" in caught.value.message
    assert "secret" not in caught.value.message


def test_sqlite_store_is_in_wal_mode(tmp_path) -> None:
    path = tmp_path / "w.db"
    EventStore.open(str(path), synchronous="NORMAL").close()
    engine = create_engine(f"sqlite:///{path}")
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
    engine.dispose()
    with pytest.raises(ValueError, match="synchronous"):
        EventStore.open(str(path), synchronous="EXTRA")


def test_store_errors_are_subclasses_with_one_message() -> None:
    with pytest.raises(TypeError):
        StoreError("raise a subclass")
    assert issubclass(SeqConflict, StoreError) and SeqConflict("x").message == "x"


def test_public_names_are_exported() -> None:
    public = {name for name in dir(salvor.store) if not name.startswith("_")}
    assert public == {
        "DEFAULT_MAX_PAYLOAD_BYTES",
        "DEFAULT_MAX_RUN_BYTES",
        "DEFAULT_MAX_RUN_EVENTS",
        "ENDING_MARGIN_BYTES",
        "PayloadTooLarge",
        "QuotaExceeded",
        "RunQuota",
        "AppendRequest",
        "ChangeNotice",
        "BadCursor",
        "Claim",
        "ClaimHeld",
        "Claimed",
        "Fence",
        "Fenced",
        "NodeRecord",
        "OwnerRelease",
        "RunOwner",
        "RunOwners",
        "ClientLease",
        "ClientLeases",
        "CorruptLog",
        "EventStore",
        "FlowVersion",
        "NamedFlow",
        "Naming",
        "GRAPH_SUMMARY_KEYS",
        "GraphSummary",
        "Holder",
        "LoginSessions",
        "Notice",
        "Notification",
        "NotificationKind",
        "Outbox",
        "ParkedWrite",
        "ProbeAnswer",
        "RunHint",
        "RunSummary",
        "STORE_VERSION",
        "SUMMARY_KEYS",
        "SUMMARY_REQUIRED",
        "SeqConflict",
        "StoreError",
        "StoreLocks",
        "StoreOwned",
        "StoreTooNew",
        "StoreUnavailable",
        "StoredAgent",
        "StoredGraph",
        "default_store_url",
        "normalize_store_url",
        "notice_of",
        "open_locks",
        "sqlite_path",
        "store_fault",
        "view_from_json",
        "view_to_json",
    }


def test_an_append_survives_the_server_dropping_its_connection(
    store: EventStore, store_url: str
) -> None:
    if store.dialect != "postgresql":
        pytest.skip("only a server can drop a connection")
    _, view = store.append("a", [started()], EMPTY_VIEW)
    # What a database restart does to the idle connection the store holds for appends.
    writer_pid = store.writer._writer.dbapi_connection.info.backend_pid
    execute_sql(store_url, "SELECT pg_terminate_backend(:pid)", pid=writer_pid)
    _, view = store.append("a", [ModelCallRequested(request_hash="sha256:a")], view)
    assert store.read_view("a") == view
