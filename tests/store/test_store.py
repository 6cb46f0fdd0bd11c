"""The store's log on real databases: SQLite in tmp_path always, PostgreSQL when configured.

Every test that writes also checks what was left behind: a refused or
conflicting append must leave the log and the runs row exactly as they were.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    GuardRefusal,
    ModelCallCompleted,
    ModelCallRequested,
    NowObserved,
    Resumed,
    RunCompleted,
    SleepCompleted,
    SleepStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    encode_envelope,
    fold,
    format_instant,
)
from salvor.store import (
    AppendRequest,
    ClaimHeld,
    CorruptLog,
    EventStore,
    SeqConflict,
    normalize_store_url,
    view_from_json,
    view_to_json,
)
from sqlalchemy import create_engine, text

from tests.support.store_records import (
    USAGE,
    assert_row_matches_log,
    execute_sql,
    pay,
    run_summary,
    started,
)

# -- appending and reading back -------------------------------------------------


def test_append_reads_back_byte_identical_envelopes(store: EventStore) -> None:
    written, view = store.append("r1", [started({"env": "prod"})], EMPTY_VIEW)
    more, view = store.append(
        "r1",
        [
            ModelCallRequested(request_hash="sha256:req"),
            ModelCallCompleted(seq=1, response={"text": "héllo ✓", "n": 1.5e-9}, usage=USAGE),
        ],
        view,
    )
    written += more
    assert [e.seq for e in written] == [0, 1, 2]
    assert len({e.recorded_at for e in more}) == 1
    read = store.read_log("r1")
    assert [encode_envelope(e) for e in read] == [encode_envelope(e) for e in written]
    assert [encode_envelope(e) for e in store.read_log("r1", from_seq=2)] == [
        encode_envelope(written[2])
    ]
    assert store.read_log("nobody") == []
    assert store.read_view("nobody") is None
    assert run_summary(store, "nobody") is None


def test_a_log_is_read_in_pages_bounded_by_count_and_by_bytes(store: EventStore) -> None:
    # Model calls answered with texts of 1 KiB, then 4 KiB, then 1 KiB: pages by payload bytes.
    view = store.append("r1", [started()], EMPTY_VIEW)[1]
    for size in (1024, 4096, 1024):
        _, view = store.append("r1", [ModelCallRequested(request_hash="sha256:req")], view)
        completed = ModelCallCompleted(
            seq=view.next_seq - 1, response={"text": "é" * size}, usage=USAGE
        )
        _, view = store.append("r1", [completed], view)
    whole = [encode_envelope(e) for e in store.read_log("r1")]
    assert len(whole) == 7

    def pages(**bounds: int) -> list[list[int]]:
        read, seq = [], 0
        while page := store.read_log("r1", seq, **bounds):
            read.append([e.seq for e in page])
            assert [encode_envelope(e) for e in page] == whole[seq : seq + len(page)]
            seq = page[-1].seq + 1
        return read

    assert pages(limit=3) == [[0, 1, 2], [3, 4, 5], [6]]
    # "é" is two bytes stored: the 1 KiB text is over 2,048 bytes, the 4 KiB one over 8,192.
    assert pages(limit=100, max_bytes=3000) == [[0, 1, 2, 3], [4], [5, 6]]
    # The first event of a page is read whatever its size: a reader always moves on.
    assert pages(limit=100, max_bytes=10) == [[0], [1], [2], [3], [4], [5], [6]]
    assert store.read_log("r1", 7, limit=5, max_bytes=10) == []
    assert store.read_log("nobody", 0, limit=5, max_bytes=10) == []
    with pytest.raises(ValueError):
        store.read_log("r1", 0, max_bytes=10)


def test_the_runs_row_is_the_fold_of_the_log_after_every_append(store: EventStore) -> None:
    wake_at = (datetime.now(UTC) + timedelta(hours=1)).astimezone().isoformat()
    batches = [
        [started({"build": "42"})],
        [ModelCallRequested(request_hash="sha256:a")],
        [ModelCallCompleted(seq=1, response={"text": "call a tool"}, usage=USAGE)],
        [ToolCallRequested(tool="lookup", input={"id": 7}, effect="read", idempotency_key=None)],
        [ToolCallCompleted(seq=3, output={"found": True})],
        [NowObserved(now="2026-01-01T00:00:00+02:00"), SleepStarted(wake_at=wake_at)],
        [SleepCompleted()],
        [Suspended(reason="approve?", input_schema={"type": "object"})],
        [Resumed(input={"ok": True})],
        [ToolCallRequested(tool="pay", input={"n": 1}, effect="write", idempotency_key="k1")],
        [ToolCallCompleted(seq=10, output={"paid": True}, settled_by="operator")],
        [RunCompleted(output={"verdict": "refund"})],
    ]
    view = EMPTY_VIEW
    for batch in batches:
        _, view = store.append("r1", batch, view)
        assert store.read_view("r1") == view
        assert_row_matches_log(store, "r1")
    assert view.state == "completed"


def test_wake_at_is_stored_in_one_sortable_utc_form(store: EventStore) -> None:
    _, view = store.append("r1", [started()], EMPTY_VIEW)
    _, view = store.append("r1", [SleepStarted(wake_at="2030-06-01T12:00:00+02:00")], view)
    assert run_summary(store, "r1").wake_at == "2030-06-01T10:00:00.000000Z"
    # The log keeps what was recorded; only the index column is normalised.
    assert store.read_log("r1")[1].event.wake_at == "2030-06-01T12:00:00+02:00"


def test_a_guard_refusal_writes_nothing(store: EventStore) -> None:
    with pytest.raises(GuardRefusal):
        store.append("r1", [ModelCallRequested(request_hash="sha256:a")], EMPTY_VIEW)
    assert store.read_log("r1") == []
    assert store.read_view("r1") is None
    written, view = store.append("r1", [started()], EMPTY_VIEW)
    with pytest.raises(GuardRefusal):
        # The first event is legal, the second is not: none of the batch lands.
        store.append(
            "r1",
            [ModelCallRequested(request_hash="sha256:a"), ModelCallRequested(request_hash="b")],
            view,
        )
    assert [encode_envelope(e) for e in store.read_log("r1")] == [encode_envelope(written[0])]
    assert store.read_view("r1") == view


def test_an_empty_batch_is_a_misuse(store: EventStore) -> None:
    with pytest.raises(ValueError, match="at least one event"):
        store.append("r1", [], EMPTY_VIEW)


# -- two writers --------------------------------------------------------------


def test_two_writers_at_the_same_seq_one_wins_and_nothing_interleaves(store_url: str) -> None:
    with EventStore.open(store_url) as first, EventStore.open(store_url) as second:
        _, view = first.append("r1", [started()], EMPTY_VIEW)
        won, _ = first.append("r1", [ModelCallRequested(request_hash="sha256:first")], view)
        with pytest.raises(SeqConflict, match=r"run r1 .*seq 1") as caught:
            second.append(
                "r1",
                [
                    ModelCallRequested(request_hash="sha256:second"),
                    ModelCallCompleted(seq=1, response=None, usage=USAGE),
                ],
                view,
            )
        assert caught.value.code == "divergence"
        log = second.read_log("r1")
        assert [e.seq for e in log] == [0, 1]
        assert log[1].event.request_hash == "sha256:first"
        assert encode_envelope(log[1]) == encode_envelope(won[0])
        assert_row_matches_log(second, "r1")


def test_a_view_ahead_of_the_log_cannot_leave_a_gap(store: EventStore) -> None:
    _, view = store.append("r1", [started()], EMPTY_VIEW)
    invented = dataclasses.replace(view, next_seq=view.next_seq + 1)
    with pytest.raises(SeqConflict):
        store.append("r1", [ModelCallRequested(request_hash="sha256:a")], invented)
    assert [e.seq for e in store.read_log("r1")] == [0]
    assert store.read_view("r1") == view


def test_racing_threads_keep_every_log_contiguous(store_url: str) -> None:
    stores = [EventStore.open(store_url), EventStore.open(store_url)]
    stores[0].append("r1", [started()], EMPTY_VIEW)
    wins = [0, 0]

    def writer(index: int) -> None:
        store = stores[index]
        for _ in range(40):
            view = store.read_view("r1")
            try:
                store.append("r1", [NowObserved(now=format_instant(datetime.now(UTC)))], view)
            except SeqConflict:
                continue
            wins[index] += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        log = stores[0].read_log("r1")
        assert [e.seq for e in log] == list(range(1 + sum(wins)))
        assert_row_matches_log(stores[1], "r1")
    finally:
        for store in stores:
            store.close()


# -- group commit ---------------------------------------------------------------


def test_append_batch_gives_each_request_its_own_outcome(store: EventStore) -> None:
    _, view_b = store.append("b", [started()], EMPTY_VIEW)
    _, ahead = store.append("b", [ModelCallRequested(request_hash="sha256:b")], view_b)
    requests = [
        AppendRequest(run_id="a", events=[started()], view=EMPTY_VIEW),
        # stale: b moved on since view_b
        AppendRequest(run_id="b", events=[ModelCallRequested(request_hash="x")], view=view_b),
        AppendRequest(run_id="c", events=[RunCompleted(output=1)], view=EMPTY_VIEW),  # refused
        AppendRequest(run_id="d", events=[started({"k": "v"})], view=EMPTY_VIEW),
    ]
    results = store.append_batch(requests)
    assert isinstance(results[1], SeqConflict)
    assert isinstance(results[2], GuardRefusal)
    for index, run_id in ((0, "a"), (3, "d")):
        envelopes, view = results[index]
        assert [encode_envelope(e) for e in store.read_log(run_id)] == [
            encode_envelope(e) for e in envelopes
        ]
        assert store.read_view(run_id) == view
    assert store.read_view("b") == ahead
    assert store.read_log("c") == []


def test_append_batch_commits_many_runs_together(store: EventStore) -> None:
    results = store.append_batch(
        [AppendRequest(run_id=f"run-{i}", events=[started()], view=EMPTY_VIEW) for i in range(20)]
    )
    assert all(isinstance(result, tuple) for result in results)
    page, _ = store.list_runs()
    assert len(page) == 20


def test_a_group_writes_the_same_rows_as_appends_one_by_one(store: EventStore) -> None:
    """One transaction with one statement per kind of write: new runs, runs whose state
    moves (suspended, sleeping: the indexed columns), runs updated in place."""
    views = {}
    for run_id in ("in-place", "moves", "sleeps"):
        _, views[run_id] = store.append(run_id, [started()], EMPTY_VIEW)
    results = store.append_batch(
        [
            AppendRequest(
                run_id="in-place",
                events=[ModelCallRequested(request_hash="sha256:a")],
                view=views["in-place"],
            ),
            AppendRequest(
                run_id="moves",
                events=[Suspended(reason="approve?", input_schema={"type": "object"})],
                view=views["moves"],
            ),
            AppendRequest(
                run_id="new", events=[started({"k": "v"}), RunCompleted(output=7)], view=EMPTY_VIEW
            ),
            AppendRequest(
                run_id="sleeps",
                events=[SleepStarted(wake_at="2026-11-29T10:00:00Z")],
                view=views["sleeps"],
            ),
        ]
    )
    assert all(isinstance(result, tuple) for result in results), results
    for run_id in ("in-place", "moves", "new", "sleeps"):
        assert_row_matches_log(store, run_id)
    assert run_summary(store, "sleeps").wake_at is not None
    page, _ = store.list_runs(state="suspended")
    assert [s.run_id for s in page] == ["moves"]


def test_a_group_one_of_whose_runs_moved_on_commits_the_others(store: EventStore) -> None:
    _, first = store.append("x", [started()], EMPTY_VIEW)
    store.append("x", [ModelCallRequested(request_hash="sha256:x")], first)  # x moved on
    _, other = store.append("y", [started()], EMPTY_VIEW)
    results = store.append_batch(
        [
            AppendRequest(
                run_id="y", events=[ModelCallRequested(request_hash="sha256:y")], view=other
            ),
            AppendRequest(run_id="x", events=[RunCompleted(output=1)], view=first),  # stale
            AppendRequest(run_id="z", events=[started()], view=EMPTY_VIEW),
        ]
    )
    assert isinstance(results[1], SeqConflict)
    assert isinstance(results[0], tuple) and isinstance(results[2], tuple)
    for run_id in ("x", "y", "z"):
        assert_row_matches_log(store, run_id)
    assert [e.kind for e in store.read_log("x")] == ["RunStarted", "ModelCallRequested"]


# -- damage ---------------------------------------------------------------------


def test_a_corrupt_runs_row_degrades_only_its_own_entry(store: EventStore, store_url: str) -> None:
    for run_id in ("a", "b", "c"):
        store.append(run_id, [started({"x": "y"})], EMPTY_VIEW)
    execute_sql(store_url, "UPDATE runs SET status = '{not json' WHERE run_id = 'b'")
    page, _ = store.list_runs()
    by_id = {summary.run_id: summary for summary in page}
    assert set(by_id) == {"a", "b", "c"}
    assert by_id["b"].degraded and not by_id["a"].degraded and not by_id["c"].degraded
    assert by_id["b"].to_json() == {
        "run": "b",
        "event_count": 1,
        "first_recorded_at": by_id["b"].first_recorded_at,
        "last_recorded_at": by_id["b"].last_recorded_at,
    }
    assert by_id["a"].to_json()["status"] == {"state": "running"}
    assert run_summary(store, "b").degraded
    # A label filter cannot match what it cannot read, and does not fail either.
    assert sorted(s.run_id for s in store.list_runs(label=("x", "y"))[0]) == ["a", "c"]


def test_a_corrupt_view_column_falls_back_to_the_log(store: EventStore, store_url: str) -> None:
    _, view = store.append("a", [started()], EMPTY_VIEW)
    execute_sql(store_url, "UPDATE runs SET \"view\" = '[]' WHERE run_id = 'a'")
    assert store.read_view("a") == view


def test_a_corrupt_payload_names_its_run_and_seq(store: EventStore, store_url: str) -> None:
    _, view = store.append("a", [started()], EMPTY_VIEW)
    store.append("a", [ModelCallRequested(request_hash="sha256:a")], view)
    execute_sql(store_url, "UPDATE events SET payload = '{\"bogus\": 1}' WHERE seq = 1")
    with pytest.raises(CorruptLog, match=r"run a at seq 1") as caught:
        store.read_log("a")
    assert (caught.value.run_id, caught.value.seq) == ("a", 1)
    assert store.read_log("a", from_seq=2) == []


def test_an_intent_row_names_its_seq_and_rows_from_before_that_still_read(
    store: EventStore, store_url: str
) -> None:
    _, view = store.append("a", [started()], EMPTY_VIEW)
    store.append(
        "a",
        [
            ModelCallRequested(request_hash="sha256:a"),
            ModelCallCompleted(seq=1, response={}, usage={"input_tokens": 1, "output_tokens": 1}),
        ],
        view,
    )
    log = store.read_log("a")
    engine = create_engine(normalize_store_url(store_url))
    try:
        with engine.connect() as connection:
            payload = connection.execute(
                text("SELECT payload FROM events WHERE run_id = 'a' AND seq = 1")
            ).scalar()
    finally:
        engine.dispose()
    assert payload == '{"seq":1,"request_hash":"sha256:a"}'
    # What a store written before intents named their seq holds: the same event.
    execute_sql(
        store_url, 'UPDATE events SET payload = \'{"request_hash": "sha256:a"}\' WHERE seq = 1'
    )
    assert store.read_log("a") == log
    execute_sql(
        store_url,
        'UPDATE events SET payload = \'{"seq": 2, "request_hash": "sha256:a"}\' WHERE seq = 1',
    )
    with pytest.raises(
        CorruptLog, match=r"run a at seq 1 .*payload `seq` 2 is not the event's position 1"
    ):
        store.read_log("a")


# -- the view codec -----------------------------------------------------------------


def test_view_json_round_trips_and_refuses_a_partial_view() -> None:
    view = fold([])
    assert view_from_json(view_to_json(view)) == view
    body = view_to_json(view)
    del body["next_seq"]
    with pytest.raises(ValueError):
        view_from_json(body)


# -- what the daemon counts ----------------------------------------------------------


def test_the_commit_observer_hears_each_committed_transaction_once(store_url: str) -> None:
    heard: list[tuple[int, float]] = []
    appends: list[int] = []

    def observe(events: int, seconds: float, batches: int) -> None:
        heard.append((events, seconds))
        appends.append(batches)

    store = EventStore.open(store_url, commit_observer=observe)
    try:
        _, view_a = store.append("a", [started()], EMPTY_VIEW)
        assert [events for events, _ in heard] == [1]
        _, view_a = store.append("a", [pay("k")], view_a, claim="pay:k")
        # One group: two runs' batches (1 + 2 events) and a refused one, in one transaction.
        store.append_batch(
            [
                AppendRequest(run_id="b", events=[started()], view=EMPTY_VIEW),
                AppendRequest(
                    run_id="c", events=[started(), RunCompleted(output=1)], view=EMPTY_VIEW
                ),
                AppendRequest(run_id="d", events=[RunCompleted(output=1)], view=EMPTY_VIEW),
            ]
        )
        assert [events for events, _ in heard] == [1, 1, 3]
        # Its appends: the two runs' batches that committed (the refused one is not).
        assert appends == [1, 1, 2]
        # Nothing committed, nothing heard: a claim another run holds, a stale view.
        _, view_e = store.append("e", [started()], EMPTY_VIEW)
        heard.clear()
        with pytest.raises(ClaimHeld):
            store.append("e", [pay("k")], view_e, claim="pay:k")
        stale = fold(store.read_log("a")[:1])  # "a" has moved on since its head
        with pytest.raises(SeqConflict):
            store.append("a", [RunCompleted(output=1)], stale)
        assert heard == []
        # A group one of whose runs moved on is committed again one transaction per request.
        store.append_batch(
            [
                AppendRequest(run_id="f", events=[started()], view=EMPTY_VIEW),
                AppendRequest(run_id="a", events=[RunCompleted(output=1)], view=stale),
            ]
        )
        assert [events for events, _ in heard] == [1]
        assert all(seconds >= 0 for _, seconds in heard)
    finally:
        store.close()
