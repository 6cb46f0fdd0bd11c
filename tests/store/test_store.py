"""The store on real databases: SQLite in tmp_path always, PostgreSQL when configured.

Every test that writes also checks what was left behind: a refused or
conflicting append must leave the log and the runs row exactly as they were.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    GraphRunStarted,
    GuardRefusal,
    ModelCallCompleted,
    ModelCallRequested,
    NowObserved,
    Resumed,
    RunAbandoned,
    RunCompleted,
    RunStarted,
    SleepCompleted,
    SleepStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    encode_envelope,
    fold,
    fork_head,
    format_instant,
    plan_fork,
)
from salvor.store import (
    AppendRequest,
    BadCursor,
    ClaimHeld,
    CorruptLog,
    EventStore,
    SeqConflict,
    normalize_store_url,
    view_from_json,
    view_to_json,
)
from sqlalchemy import create_engine, text

from tests.support.graph_runs import PUBLISH_WRITE, published
from tests.support.store_records import (
    GRAPH_DOCUMENT,
    GRAPH_SUMMARY,
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


# -- claims ---------------------------------------------------------------------


def test_a_claim_lets_exactly_one_run_execute_an_identity(store: EventStore) -> None:
    _, view_a = store.append("a", [started()], EMPTY_VIEW)
    _, view_b = store.append("b", [started()], EMPTY_VIEW)
    _, view_a = store.append("a", [pay("c-1")], view_a, claim="pay:c-1")
    claim = store.claims.get_claim("pay:c-1")
    assert (claim.run_id, claim.seq, claim.state, claim.output) == ("a", 1, "open", None)

    with pytest.raises(ClaimHeld) as held:
        store.append("b", [pay("c-1")], view_b, claim="pay:c-1")
    assert (held.value.identity, held.value.run_id, held.value.seq, held.value.state) == (
        "pay:c-1",
        "a",
        1,
        "open",
    )
    assert "pay:c-1" in held.value.message
    assert [e.seq for e in store.read_log("b")] == [0]
    assert store.read_view("b") == view_b

    _, view_a = store.append(
        "a", [ToolCallCompleted(seq=1, output={"paid": 12})], view_a, settle="pay:c-1"
    )
    claim = store.claims.get_claim("pay:c-1")
    assert (claim.state, claim.output) == ("settled", {"paid": 12})
    with pytest.raises(ClaimHeld) as held:
        store.append("b", [pay("c-1")], view_b, claim="pay:c-1")
    assert held.value.state == "settled"
    assert store.claims.get_claim("nothing") is None


def test_settling_an_identity_held_by_another_run_writes_nothing(store: EventStore) -> None:
    _, view_a = store.append("a", [started()], EMPTY_VIEW)
    store.append("a", [pay("k")], view_a, claim="pay:k")
    _, view_b = store.append("b", [started()], EMPTY_VIEW)
    _, view_b = store.append("b", [pay("k")], view_b)
    with pytest.raises(ClaimHeld):
        store.append("b", [ToolCallCompleted(seq=1, output=1)], view_b, settle="pay:k")
    assert store.read_view("b") == view_b
    assert store.claims.get_claim("pay:k").state == "open"


def test_a_failed_call_releases_only_its_own_open_claim(store: EventStore) -> None:
    _, view_a = store.append("a", [started()], EMPTY_VIEW)
    _, view_a = store.append("a", [pay("k")], view_a, claim="pay:k")
    _, view_b = store.append("b", [started()], EMPTY_VIEW)
    _, view_b = store.append("b", [pay("k")], view_b)
    # Another run's completion naming the identity leaves the holder's claim alone.
    _, view_b = store.append("b", [ToolCallCompleted(seq=1, output=1)], view_b, release="pay:k")
    assert store.claims.get_claim("pay:k").state == "open"

    _, view_a = store.append("a", [ToolCallCompleted(seq=1, output=0)], view_a, release="pay:k")
    assert store.claims.get_claim("pay:k") is None
    # Released, the identity is free for the next caller.
    _, view_b = store.append("b", [pay("k")], view_b, claim="pay:k")
    assert (store.claims.get_claim("pay:k").run_id, store.claims.get_claim("pay:k").seq) == ("b", 3)


def test_a_release_never_undoes_a_settled_outcome(store: EventStore) -> None:
    _, view = store.append("a", [started()], EMPTY_VIEW)
    _, view = store.append("a", [pay("k")], view, claim="pay:k")
    _, view = store.append("a", [ToolCallCompleted(seq=1, output=7)], view, settle="pay:k")
    _, view = store.append("a", [pay("k")], view)
    store.append("a", [ToolCallCompleted(seq=3, output=0)], view, release="pay:k")
    claim = store.claims.get_claim("pay:k")
    assert (claim.seq, claim.state, claim.output) == (1, "settled", 7)


def test_claim_and_settle_need_their_events(store: EventStore) -> None:
    with pytest.raises(ValueError, match="ToolCallRequested"):
        store.append("a", [started()], EMPTY_VIEW, claim="x")
    with pytest.raises(ValueError, match="ToolCallCompleted"):
        store.append("a", [started()], EMPTY_VIEW, settle="x")
    with pytest.raises(ValueError, match="ToolCallCompleted"):
        store.append("a", [started()], EMPTY_VIEW, release="x")
    assert store.read_log("a") == []


# -- listing ----------------------------------------------------------------------


def make_runs(store: EventStore, count: int) -> list[str]:
    """``count`` runs labelled batch=i%3; every fifth one completed."""
    requests = []
    for i in range(count):
        events = [started({"batch": str(i % 3), "i": str(i)})]
        if i % 5 == 0:
            events.append(RunCompleted(output=i))
        requests.append(AppendRequest(run_id=f"run-{i:03d}", events=events, view=EMPTY_VIEW))
    for start in range(0, count, 50):
        # Several commits, so first_recorded_at both differs and ties.
        results = store.append_batch(requests[start : start + 50])
        assert all(isinstance(result, tuple) for result in results)
    return [request.run_id for request in requests]


def newest_first(store: EventStore, run_ids: list[str]) -> list[str]:
    summaries = [run_summary(store, run_id) for run_id in run_ids]
    summaries.sort(key=lambda s: (s.first_recorded_at, s.run_id), reverse=True)
    return [s.run_id for s in summaries]


def page_through(store: EventStore, **filters) -> list[str]:
    seen, cursor = [], None
    while True:
        page, cursor = store.list_runs(after=cursor, **filters)
        seen += [summary.run_id for summary in page]
        if cursor is None:
            return seen


def test_list_runs_pages_newest_first_across_250_runs(store: EventStore) -> None:
    run_ids = make_runs(store, 250)
    expected = newest_first(store, run_ids)
    everything, cursor = store.list_runs()
    assert cursor is None
    assert [s.run_id for s in everything] == expected
    assert page_through(store, limit=40) == expected
    assert page_through(store, limit=250) == expected
    first_page, cursor = store.list_runs(limit=1)
    assert [s.run_id for s in first_page] == expected[:1] and cursor is not None


def test_list_runs_filters_by_state_and_label(store: EventStore) -> None:
    run_ids = make_runs(store, 250)
    expected = newest_first(store, run_ids)
    completed = [r for r in expected if int(r[-3:]) % 5 == 0]
    assert page_through(store, state="completed", limit=7) == completed
    assert [s.run_id for s in store.list_runs(state="running")[0]] == [
        r for r in expected if r not in completed
    ]
    batch_one = [r for r in expected if int(r[-3:]) % 3 == 1]
    assert page_through(store, label=("batch", "1"), limit=7) == batch_one
    assert page_through(store, label=("batch", "1"), state="completed", limit=3) == [
        r for r in batch_one if r in completed
    ]
    # "i" = "1" must not match runs whose i merely starts with 1.
    assert page_through(store, label=("i", "1")) == ["run-001"]
    assert store.list_runs(label=("batch", "9")) == ([], None)


def test_list_runs_filters_by_agent_and_by_graph(store: EventStore) -> None:
    refunds, triage = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    publish = "sha256:" + "d" * 64
    heads = {
        "r1": RunStarted(agent_def_hash=refunds, input=1),
        "t1": RunStarted(agent_def_hash=triage, input=2),
        "g1": GraphRunStarted(graph_hash=publish, input=None),
        "r2": RunStarted(agent_def_hash=refunds, input=3),
        "g2": GraphRunStarted(graph_hash="sha256:" + "e" * 64, input=None),
    }
    for run_id, head in heads.items():
        store.append(
            run_id, [head, *([RunCompleted(output=3)] if run_id == "r2" else [])], EMPTY_VIEW
        )

    def listed(**filters) -> set[str]:
        return set(page_through(store, limit=1, **filters))

    assert listed(agent_def_hash=refunds) == {"r1", "r2"}
    assert listed(agent_def_hash=refunds, state="running") == {"r1"}
    assert listed(graph_hash=publish) == {"g1"}
    # An agent's hash is not a graph's: the two filters read their own column.
    assert listed(graph_hash=refunds) == set() and listed(agent_def_hash=publish) == set()
    assert listed(agent_def_hash=refunds, graph_hash=publish) == set()
    assert page_through(store, agent_def_hash=refunds) == newest_first(store, ["r1", "r2"])


def test_label_filter_takes_sql_wildcards_literally(store: EventStore) -> None:
    store.append("a", [started({"k": "50%_off"})], EMPTY_VIEW)
    store.append("b", [started({"k": "50xxoff"})], EMPTY_VIEW)
    store.append("c", [started({"k": 'say "hi"'})], EMPTY_VIEW)
    assert [s.run_id for s in store.list_runs(label=("k", "50%_off"))[0]] == ["a"]
    assert [s.run_id for s in store.list_runs(label=("k", 'say "hi"'))[0]] == ["c"]


def test_a_foreign_cursor_is_refused(store: EventStore) -> None:
    with pytest.raises(BadCursor) as caught:
        store.list_runs(after="not-a-cursor")
    assert caught.value.status == 400


def test_summary_json_omits_what_is_unknown(store: EventStore) -> None:
    store.append("plain", [started()], EMPTY_VIEW)
    store.append("empty", [started({})], EMPTY_VIEW)
    store.append("tagged", [started({"env": "prod"})], EMPTY_VIEW)
    plain = run_summary(store, "plain").to_json()
    assert list(plain) == [
        "run",
        "status",
        "event_count",
        "first_recorded_at",
        "last_recorded_at",
        "usage",
        "step_count",
        "agent_def_hash",
    ]
    assert plain["status"] == {"state": "running"}
    assert plain["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert plain["step_count"] == 0
    assert "labels" not in run_summary(store, "empty").to_json()
    assert run_summary(store, "tagged").to_json()["labels"] == {"env": "prod"}


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


# -- agents -----------------------------------------------------------------------


def test_agents_are_stored_once_and_verbatim(store: EventStore) -> None:
    definition = 'model = "m"\nname = "triage"\n'
    assert store.definitions.put_agent(
        "sha256:1", format="toml", definition=definition, name="triage"
    )
    assert not store.definitions.put_agent("sha256:1", format="toml", definition="other", name=None)
    assert store.definitions.put_agent(
        "sha256:2", format="json", definition='{"model":"m"}', name=None
    )
    markdown = "---\nname: triage\nmodel: m\n---\nTriage.\n"
    assert store.definitions.put_agent("sha256:5", format="md", definition=markdown, name="triage")
    assert (
        store.definitions.get_agent("sha256:5").format,
        store.definitions.get_agent("sha256:5").definition,
    ) == (
        "md",
        markdown,
    )
    agent = store.definitions.get_agent("sha256:1")
    assert (agent.format, agent.definition, agent.name) == ("toml", definition, "triage")
    assert store.definitions.get_agent("sha256:2").name is None
    assert store.definitions.get_agent("sha256:3") is None
    assert [a.agent_def_hash for a in store.definitions.list_agents()] == [
        "sha256:1",
        "sha256:2",
        "sha256:5",
    ]
    with pytest.raises(ValueError, match="toml"):
        store.definitions.put_agent("sha256:4", format="yaml", definition="", name=None)


# -- graphs -------------------------------------------------------------------------


def test_graphs_are_stored_once_and_as_submitted(store: EventStore) -> None:
    assert store.definitions.put_graph("sha256:g1", document=GRAPH_DOCUMENT, summary=GRAPH_SUMMARY)
    assert not store.definitions.put_graph(
        "sha256:g1", document={"other": True}, summary={**GRAPH_SUMMARY, "node_count": 9}
    )
    other = {**GRAPH_SUMMARY, "entry_nodes": ["a", "b"], "terminal_nodes": []}
    assert store.definitions.put_graph("sha256:g2", document={"n": [1.5, "ü"]}, summary=other)
    stored = store.definitions.get_graph("sha256:g1")
    assert stored.document == GRAPH_DOCUMENT
    assert json.dumps(stored.document) == json.dumps(GRAPH_DOCUMENT)  # key order too
    assert store.definitions.get_graph("sha256:g2").document == {"n": [1.5, "ü"]}
    assert store.definitions.get_graph("sha256:g3") is None
    listed = store.definitions.list_graphs()
    assert [g.graph_hash for g in listed] == ["sha256:g1", "sha256:g2"]
    assert [g.summary() for g in listed] == [GRAPH_SUMMARY, other]
    assert listed[0].created_at == stored.created_at


def test_a_graph_with_a_summary_of_another_shape_is_a_misuse(store: EventStore) -> None:
    with pytest.raises(ValueError, match="entry_nodes"):
        store.definitions.put_graph("sha256:g1", document={}, summary={"node_count": 1})
    assert store.definitions.list_graphs() == []


def test_graphs_survive_reopening_the_store(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        store.definitions.put_graph("sha256:g1", document=GRAPH_DOCUMENT, summary=GRAPH_SUMMARY)
    with EventStore.open(store_url) as store:
        assert store.definitions.get_graph("sha256:g1").document == GRAPH_DOCUMENT
        assert [g.summary() for g in store.definitions.list_graphs()] == [GRAPH_SUMMARY]


# -- the view codec -----------------------------------------------------------------


def test_view_json_round_trips_and_refuses_a_partial_view() -> None:
    view = fold([])
    assert view_from_json(view_to_json(view)) == view
    body = view_to_json(view)
    del body["next_seq"]
    with pytest.raises(ValueError):
        view_from_json(body)


# -- probe answers ----------------------------------------------------------------------


def test_a_probe_answer_is_upserted_per_open_write_and_read_by_pairs(store: EventStore) -> None:
    store.claims.put_probe_answer(
        "a",
        3,
        tool="lookup_refund",
        probe_input={"invoice_id": "I"},
        answer=None,
        error="the lookup timed out",
        verdict="unknown",
    )
    store.claims.put_probe_answer(
        "a",
        3,
        tool="lookup_refund",
        probe_input={"invoice_id": "I"},
        answer={"found": True, "refund": {"refund_id": "rf_1"}},
        error=None,
        verdict="landed",
    )
    store.claims.put_probe_answer(
        "b",
        7,
        tool="lookup_refund",
        probe_input={"invoice_id": "J"},
        answer={"found": None},
        error=None,
        verdict="unknown",
    )
    found = store.claims.probe_answers([("a", 3), ("b", 7), ("a", 4), ("a", 3)])
    assert set(found) == {("a", 3), ("b", 7)}
    latest = found[("a", 3)]
    # The second probe of the same write replaced the first.
    assert (latest.answer, latest.error, latest.verdict) == (
        {"found": True, "refund": {"refund_id": "rf_1"}},
        None,
        "landed",
    )
    assert latest.tool == "lookup_refund" and latest.input == {"invoice_id": "I"}
    assert latest.observed_at.endswith("Z")
    assert found[("b", 7)].answer == {"found": None}
    assert store.claims.probe_answers([]) == {}
    with pytest.raises(ValueError, match="verdict"):
        store.claims.put_probe_answer(
            "a", 3, tool="t", probe_input={}, answer=None, error=None, verdict="maybe"
        )
    assert store.claims.probe_answers([("a", 3)])[("a", 3)].verdict == "landed"


def test_the_forks_of_a_run_are_found_by_their_origin(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        origin, _ = store.append("origin", published(), EMPTY_VIEW)
        for child, node, acknowledged in (("f1", "publish", [PUBLISH_WRITE]), ("f2", "each", [])):
            store.append(child, fork_head(plan_fork(origin, node, acknowledged)), EMPTY_VIEW)
        # A fork of a fork names its own origin, not the first one.
        store.append("f3", fork_head(plan_fork(store.read_log("f1"), "route")), EMPTY_VIEW)
        store.append(
            "plain", [GraphRunStarted(graph_hash="sha256:" + "d" * 64, input=None)], EMPTY_VIEW
        )
        forks = store.runs.list_forks("origin")
        assert [view.run_id for view in forks] == ["f1", "f2"]
        assert [view.forked_from["from_node"] for view in forks] == ["publish", "each"]
        assert forks[0].forked_from["acknowledged_writes"] == [PUBLISH_WRITE]
        assert [view.run_id for view in store.runs.list_forks("f1")] == ["f3"]
        assert store.runs.list_forks("plain") == store.runs.list_forks("nobody") == []


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


def test_the_census_counts_runs_by_state_and_the_claims_held_open(store: EventStore) -> None:
    assert store.runs.census() == ({}, 0)
    _, view_a = store.append("a", [started()], EMPTY_VIEW)
    _, view_a = store.append("a", [pay("k")], view_a, claim="pay:k")
    store.append("b", [started(), RunCompleted(output=1)], EMPTY_VIEW)
    store.append("c", [started(), Suspended(reason="ok?", input_schema={})], EMPTY_VIEW)
    assert store.runs.census() == ({"awaiting_tool": 1, "completed": 1, "suspended": 1}, 1)
    store.append("a", [ToolCallCompleted(seq=1, output=7)], view_a, settle="pay:k")
    assert store.runs.census() == ({"running": 1, "completed": 1, "suspended": 1}, 0)
