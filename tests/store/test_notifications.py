"""The notification outbox on real databases: which appends write a row, and the deliverer's
reads and marks.

A row is written in the transaction of the append whose fold makes a run start waiting on a
person (gate, question, unknown write, budget) or fail, once per such moment, and only by a
store opened with notifications on.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    BudgetExceeded,
    GuardRefusal,
    ModelCallRequested,
    Resumed,
    RunFailed,
    RunStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    question_schema,
)
from salvor.store import STORE_VERSION, AppendRequest, EventStore, SeqConflict
from sqlalchemy import create_engine, inspect, text

from tests.store.test_store import execute_sql

GATE = Suspended(reason="approve the refund?", input_schema={"type": "object"})
QUESTION = {"question": "Which size?", "type": "select", "options": ["S", "M"]}


@pytest.fixture
def outbox(store_url: str):
    opened = EventStore.open(store_url, notifications=True)
    try:
        yield opened
    finally:
        opened.close()


def started(labels: dict | None = None) -> RunStarted:
    return RunStarted(agent_def_hash="sha256:agent", input={"secret": "hunter2"}, labels=labels)


def asked() -> list:
    """An ask_user call, its completion and the suspension it asks for (one batch, as recorded)."""
    return [
        ToolCallRequested(tool="ask_user", input=QUESTION, effect="read", idempotency_key=None),
        ToolCallCompleted(seq=1, output={"__salvor_suspend": {}}),
        Suspended(reason="Which size?", input_schema=question_schema(QUESTION)),
    ]


def causes(store: EventStore) -> list[tuple[str, int, str]]:
    return [(n.run_id, n.seq, n.kind) for n in store.outbox.entries()]


def walk(store: EventStore, run_id: str, *batches: list) -> None:
    view = EMPTY_VIEW
    for batch in batches:
        _, view = store.append(run_id, batch, view)


def every_kind(store: EventStore) -> None:
    """Five runs, each reaching one kind of moment and then going on past it."""
    walk(store, "gate", [started({"team": "refunds"})], [GATE], [Resumed(input={})])
    walk(store, "question", [started()], asked(), [Resumed(input={"answer": "M"})])
    walk(
        store,
        "write",
        [started()],
        [ToolCallRequested(tool="refund", input={"n": 1}, effect="write", idempotency_key=None)],
        [ToolCallCompleted(seq=1, output={"ok": True})],
    )
    walk(
        store,
        "budget",
        [started()],
        [BudgetExceeded(budget={"kind": "steps", "limit": 1}, observed=2)],
        [Resumed(input={"extend_by": 5})],
    )
    walk(store, "failed", [started()], [RunFailed(error="the model said no")])


EVERY_KIND = [
    ("gate", 1, "gate"),
    ("question", 3, "question"),
    ("write", 1, "unknown_write"),
    ("budget", 1, "budget"),
    ("failed", 1, "failed"),
]


def test_each_kind_of_wait_writes_one_row_when_it_begins(outbox: EventStore) -> None:
    every_kind(outbox)
    assert causes(outbox) == EVERY_KIND
    rows = {n.run_id: n for n in outbox.outbox.entries()}
    assert all(n.attempts == 0 and n.delivered_at is None for n in rows.values())
    gate = rows["gate"]
    (suspended,) = [e for e in outbox.read_log("gate") if e.seq == 1]
    assert json.loads(gate.body) == {
        "kind": "gate",
        "run": "gate",
        "seq": 1,
        "recorded_at": suspended.recorded_at,
        "status": {"state": "suspended", **GATE.to_payload()},
        "labels": {"team": "refunds"},
    }
    assert gate.created_at == gate.next_attempt_at == suspended.recorded_at
    # Never the run's input: the operator's receiver is not the run's reader.
    assert all("hunter2" not in n.body for n in rows.values())
    assert "labels" not in json.loads(rows["failed"].body)
    assert json.loads(rows["failed"].body)["status"] == {
        "state": "failed",
        "error": "the model said no",
    }


def test_a_store_opened_without_notifications_writes_none(store: EventStore) -> None:
    every_kind(store)
    assert store.outbox.entries() == []


def test_a_group_commit_writes_the_rows_of_its_appends(outbox: EventStore) -> None:
    _, gate = outbox.append("gate", [started()], EMPTY_VIEW)
    _, busy = outbox.append("busy", [started()], EMPTY_VIEW)
    results = outbox.append_batch(
        [
            AppendRequest(run_id="gate", events=[GATE], view=gate),
            AppendRequest(
                run_id="busy", events=[ModelCallRequested(request_hash="sha256:r")], view=busy
            ),
            AppendRequest(run_id="new", events=[started(), RunFailed(error="x")], view=EMPTY_VIEW),
        ]
    )
    assert all(isinstance(result, tuple) for result in results)
    assert causes(outbox) == [("gate", 1, "gate"), ("new", 1, "failed")]


def test_what_is_no_new_wait_writes_nothing(outbox: EventStore) -> None:
    # A write recorded with its completion (a client that performed it) never waited; a signal
    # wait is owed by a system, not a person; a model call is no wait.
    walk(
        outbox,
        "performed",
        [started()],
        [
            ToolCallRequested(tool="refund", input={}, effect="write", idempotency_key=None),
            ToolCallCompleted(seq=1, output={"ok": True}),
        ],
    )
    walk(
        outbox,
        "signal",
        [started()],
        [Suspended(reason="webhook", input_schema={"type": "object"}, kind="signal")],
    )
    walk(outbox, "thinking", [started()], [ModelCallRequested(request_hash="sha256:r")])
    # A gate whose schema only looks like part of a question is a gate.
    lookalike = {"type": "object", "required": ["answer"], "properties": {"answer": {}}}
    walk(outbox, "gate", [started()], [Suspended(reason="ok?", input_schema=lookalike)])
    assert causes(outbox) == [("gate", 1, "gate")]


def test_a_refused_or_conflicting_append_writes_no_row(outbox: EventStore) -> None:
    _, view = outbox.append("r", [started()], EMPTY_VIEW)
    with pytest.raises(GuardRefusal):
        outbox.append("r", [RunFailed(error="x"), RunFailed(error="y")], view)
    outbox.append("r", [ModelCallRequested(request_hash="sha256:r")], view)
    with pytest.raises(SeqConflict):
        outbox.append("r", [GATE], view)  # a second writer at seq 1, behind the first
    assert outbox.outbox.entries() == []


def test_a_second_wait_of_one_run_is_a_row_of_its_own(outbox: EventStore) -> None:
    walk(outbox, "r", [started()], [GATE], [Resumed(input={})], [GATE])
    assert causes(outbox) == [("r", 1, "gate"), ("r", 3, "gate")]


def test_due_rows_oldest_first_bounded_and_marked(outbox: EventStore) -> None:
    for index in range(5):
        walk(outbox, f"r{index}", [started()], [RunFailed(error="x")])
    now = datetime.now(UTC) + timedelta(seconds=1)
    first = outbox.outbox.due(now, limit=3)
    assert [n.run_id for n in first] == ["r0", "r1", "r2"]
    assert outbox.outbox.next_due() <= now

    outbox.outbox.mark_delivered(first[0].id)
    later = now + timedelta(minutes=1)
    outbox.outbox.failed(first[1].id, later)
    outbox.outbox.postpone(first[2].id, later)
    outbox.outbox.withdraw(outbox.outbox.due(now)[-1].id)  # r4's

    assert [n.run_id for n in outbox.outbox.due(now)] == ["r3"]
    assert [n.run_id for n in outbox.outbox.due(later)] == ["r3", "r1", "r2"]
    rows = {n.run_id: n for n in outbox.outbox.entries()}
    assert set(rows) == {"r0", "r1", "r2", "r3"}
    assert rows["r0"].delivered_at is not None and rows["r0"].attempts == 0
    assert rows["r1"].attempts == 1 and rows["r2"].attempts == 0
    assert outbox.outbox.entries("r1") == [rows["r1"]]
    outbox.outbox.mark_delivered(rows["r3"].id)
    assert outbox.outbox.next_due() == later
    for run_id in ("r1", "r2"):
        outbox.outbox.mark_delivered(rows[run_id].id)
    assert outbox.outbox.next_due() is None


def test_a_version_5_store_gains_the_outbox(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        walk(store, "old", [started()], [GATE])
    execute_sql(store_url, "DROP TABLE notifications")
    execute_sql(store_url, "UPDATE store_meta SET value = 5")
    with EventStore.open(store_url, notifications=True) as store:
        assert store.outbox.entries() == []  # nothing is made up for waits before it
        walk(store, "new", [started()], [GATE])
        assert causes(store) == [("new", 1, "gate")]
    engine = create_engine(store_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as connection:
        indexes = {index["name"] for index in inspect(connection).get_indexes("notifications")}
        version = connection.execute(text("SELECT value FROM store_meta")).scalar_one()
    engine.dispose()
    assert "ix_notifications_due" in indexes and version == STORE_VERSION
