"""Run ownership in the store: node leases on the database's clock, claims as compare-and-set,
and fenced appends, on SQLite and PostgreSQL.

A lease is made to lapse by writing its expiry into the past behind the store's back (never by
waiting), so no test depends on how fast the machine is.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    ModelCallCompleted,
    ModelCallRequested,
    RunAbandoned,
    RunCompleted,
    RunStarted,
    parse_instant,
)
from salvor.store import (
    AppendRequest,
    Claimed,
    EventStore,
    Fence,
    Fenced,
    OwnerRelease,
    RunOwner,
    SeqConflict,
)

from tests.store.test_store import assert_row_matches_log, execute_sql

LEASE = 30.0
USAGE = {"input_tokens": 1, "output_tokens": 1}
PAST = "2000-01-01T00:00:00.000000Z"
INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def started() -> RunStarted:
    return RunStarted(agent_def_hash="sha256:agent", input={"task": "refund"})


def register(store: EventStore, node_id: str, lease: float = LEASE) -> str:
    return store.owners.register(
        node_id, name=node_id, host="h", boot_id="b", pid=1, pid_start="7", lease_seconds=lease
    )


def lapse(store_url: str, node_id: str) -> None:
    """The node's lease ran out (written behind the store's back)."""
    execute_sql(
        store_url, "UPDATE nodes SET lease_expires_at = :at WHERE node_id = :n", at=PAST, n=node_id
    )


def owner_columns(store_url: str, run_id: str) -> tuple:
    from salvor.store import normalize_store_url
    from sqlalchemy import create_engine, text

    engine = create_engine(normalize_store_url(store_url))
    try:
        with engine.connect() as connection:
            return tuple(
                connection.execute(
                    text(
                        "SELECT owner_node, owner_epoch, owner_driving FROM runs WHERE run_id = :r"
                    ),
                    {"r": run_id},
                ).one()
            )
    finally:
        engine.dispose()


def test_a_lease_is_written_from_the_databases_clock_in_the_stores_form(
    store: EventStore,
) -> None:
    first = register(store, "n1", lease=5)
    longer = register(store, "n2", lease=500)
    for expiry in (first, longer):
        assert INSTANT.fullmatch(expiry), expiry
    # Text order is time order, and the lease lies ahead by about what was asked.
    assert first < longer
    assert 400 < (parse_instant(longer) - parse_instant(first)).total_seconds() < 600
    n1, _ = store.owners.nodes()
    assert (n1.node_id, n1.boot_id, n1.pid, n1.pid_start) == ("n1", "b", 1, "7")
    assert n1.lease_expires_at == first and n1.stopped_at is None
    assert INSTANT.fullmatch(n1.started_at) and n1.started_at < first
    store.owners.set_listen("n2", "http://127.0.0.1:9")
    assert store.owners.nodes()[1].listen == "http://127.0.0.1:9"


def test_a_lease_renews_while_it_holds_and_never_once_it_lapsed(
    store: EventStore, store_url: str
) -> None:
    expiry = register(store, "n1", lease=5)
    assert store.owners.renew("n1", 500)
    assert store.owners.nodes()[0].lease_expires_at > expiry
    lapse(store_url, "n1")
    assert not store.owners.renew("n1", 500)
    assert store.owners.nodes()[0].lease_expires_at == PAST
    assert not store.owners.renew("nobody", 5)


def test_a_retired_node_cannot_renew_and_its_runs_are_free(store: EventStore) -> None:
    register(store, "n1")
    register(store, "n2")
    fence = store.owners.claim("r", "n1").fence
    store.append("r", [started()], EMPTY_VIEW, fence=fence)
    store.owners.retire("n1")
    assert not store.owners.renew("n1", LEASE)
    (n1, _) = store.owners.nodes()
    assert n1.stopped_at is not None and n1.lease_expires_at <= n1.stopped_at
    assert store.owners.owner("r") == RunOwner("r", "n1", 1, True, False)
    assert store.owners.claim("r", "n2").fence == Fence("n2", 2)


def test_a_claim_is_a_compare_and_set_that_raises_the_epoch(
    store: EventStore, store_url: str
) -> None:
    register(store, "n1")
    register(store, "n2")
    # A run that does not exist yet is won at epoch 1, and its creating append makes it owned.
    first = store.owners.claim("r", "n1")
    assert first == Claimed(Fence("n1", 1), None)
    assert store.owners.owner("r") is None
    _, view = store.append("r", [started()], EMPTY_VIEW, fence=first.fence)
    assert owner_columns(store_url, "r") == ("n1", 1, 1)
    assert store.owners.owner("r") == RunOwner("r", "n1", 1, True, True)

    # A live owner driving it: nobody else wins, nor does it win again.
    lost = store.owners.claim("r", "n2")
    assert lost == Claimed(None, RunOwner("r", "n1", 1, True, True))
    assert store.owners.claim("r", "n1").fence is None

    # Released, the owner column stays but anyone may claim it.
    store.owners.release("r", Fence("n1", 1))
    assert store.owners.owner("r") == RunOwner("r", "n1", 1, False, True)
    assert store.owners.claim("r", "n2").fence == Fence("n2", 2)
    # A stale release changes nothing.
    store.owners.release("r", Fence("n1", 1))
    assert store.owners.owner("r") == RunOwner("r", "n2", 2, True, True)

    # The owner's lease lapses: a takeover, and the lapsed node is marked stopped for good.
    lapse(store_url, "n2")
    assert store.owners.owner("r").node_live is False
    register(store, "n3")
    assert store.owners.claim("r", "n3").fence == Fence("n3", 3)
    assert next(n for n in store.owners.nodes() if n.node_id == "n2").stopped_at is not None
    assert not store.owners.renew("n2", LEASE)

    # An owner the caller proved dead is taken over though its lease holds.
    assert store.owners.claim("r", "n1", dead_nodes=["n3"]).fence == Fence("n1", 4)
    assert not store.owners.renew("n3", LEASE)
    assert owner_columns(store_url, "r") == ("n1", 4, 1)
    assert_row_matches_log(store, "r")
    assert view.next_seq == 1


def test_claims_made_together_each_get_their_own_outcome(store: EventStore, store_url: str) -> None:
    register(store, "n1")
    register(store, "n2")
    for run_id in ("held", "free"):
        store.append(run_id, [started()], EMPTY_VIEW)  # unfenced: no owner yet
    store.owners.claim("held", "n2")
    outcomes = store.owners.claim_many(["new", "held", "free", "new"], "n1")
    assert outcomes == [
        Claimed(Fence("n1", 1), None),
        Claimed(None, RunOwner("held", "n2", 1, True, True)),
        Claimed(Fence("n1", 1), None),
        Claimed(Fence("n1", 1), None),
    ]
    assert owner_columns(store_url, "free") == ("n1", 1, 1)
    # A claimer whose lease lapsed is refused for every run, and nothing is written.
    lapse(store_url, "n2")
    refused = store.owners.claim_many(["held", "free"], "n2")
    assert all(isinstance(outcome, Fenced) for outcome in refused)
    assert [o.run_id for o in refused] == ["held", "free"]
    assert owner_columns(store_url, "free") == ("n1", 1, 1)


def test_a_node_without_a_live_lease_claims_nothing(store: EventStore, store_url: str) -> None:
    register(store, "n1")
    store.append("r", [started()], EMPTY_VIEW)
    lapse(store_url, "n1")
    for node in ("n1", "never-registered"):
        with pytest.raises(Fenced, match=node):
            store.owners.claim("r", node)
    assert store.owners.owner("r") == RunOwner("r", None, 0, False, False)


def test_a_stale_fence_is_refused_while_the_rest_of_its_group_commits(
    store: EventStore, store_url: str
) -> None:
    register(store, "old")
    register(store, "new")
    views = {}
    for run_id in ("a", "b"):
        fence = store.owners.claim(run_id, "old").fence
        _, views[run_id] = store.append(run_id, [started()], EMPTY_VIEW, fence=fence)
    lapse(store_url, "old")
    taken = store.owners.claim("a", "new").fence
    assert taken == Fence("new", 2)
    results = store.append_batch(
        [
            # The paused driver wakes and appends with its stale fence.
            AppendRequest(
                run_id="a",
                events=[ModelCallRequested(request_hash="sha256:a")],
                view=views["a"],
                fence=Fence("old", 1),
            ),
            # Its other run was not taken: its fence still holds in the store.
            AppendRequest(
                run_id="b",
                events=[ModelCallRequested(request_hash="sha256:b")],
                view=views["b"],
                fence=Fence("old", 1),
            ),
            AppendRequest(run_id="c", events=[started()], view=EMPTY_VIEW),
        ]
    )
    assert isinstance(results[0], Fenced), results[0]
    message = results[0].message
    assert "run a" in message and "epoch 1" in message and "new at epoch 2" in message
    assert (results[0].owner_node, results[0].owner_epoch) == ("new", 2)
    assert isinstance(results[1], tuple) and isinstance(results[2], tuple)
    assert [e.kind for e in store.read_log("a")] == ["RunStarted"]
    assert [e.kind for e in store.read_log("b")] == ["RunStarted", "ModelCallRequested"]
    for run_id in ("a", "b", "c"):
        assert_row_matches_log(store, run_id)
    # One append alone is refused the same way, and the new owner's goes in.
    with pytest.raises(Fenced):
        store.append(
            "a", [ModelCallRequested(request_hash="sha256:a")], views["a"], fence=Fence("old", 1)
        )
    store.append("a", [ModelCallRequested(request_hash="sha256:a")], views["a"], fence=taken)
    assert owner_columns(store_url, "a") == ("new", 2, 1)
    assert_row_matches_log(store, "a")


def test_a_group_of_only_stale_fences_writes_nothing(store: EventStore, store_url: str) -> None:
    register(store, "n1")
    register(store, "n2")
    fence = store.owners.claim("a", "n1").fence
    _, view = store.append("a", [started()], EMPTY_VIEW, fence=fence)
    store.owners.release("a", fence)
    store.owners.claim("a", "n2")
    (result,) = store.append_batch(
        [
            AppendRequest(
                run_id="a", events=[RunCompleted(output=1)], view=view, fence=Fence("n1", 1)
            )
        ]
    )
    assert isinstance(result, Fenced)
    assert store.read_view("a") == view


def test_a_release_commits_in_its_group_and_a_stale_one_changes_nothing(
    store: EventStore, store_url: str
) -> None:
    commits = []
    store.writer._commit_observer = lambda events, _seconds, appends: commits.append(
        (events, appends)
    )
    register(store, "n1")
    register(store, "n2")
    fences, views = {}, {}
    for run_id in ("a", "b", "c"):
        fences[run_id] = store.owners.claim(run_id, "n1").fence
        _, views[run_id] = store.append(run_id, [started()], EMPTY_VIEW, fence=fences[run_id])
    # Run c was taken over: its old drive's release must not free the new owner's hold.
    lapse(store_url, "n1")
    taken = store.owners.claim("c", "n2").fence
    commits.clear()
    results = store.append_batch(
        [
            AppendRequest(
                run_id="a", events=[RunCompleted(output=1)], view=views["a"], fence=fences["a"]
            ),
            OwnerRelease("a", fences["a"]),
            OwnerRelease("c", fences["c"]),
            AppendRequest(
                run_id="b",
                events=[ModelCallRequested(request_hash="sha256:b")],
                view=views["b"],
                fence=fences["b"],
            ),
        ]
    )
    assert isinstance(results[0], tuple) and isinstance(results[3], tuple), results
    assert results[1] is None and results[2] is None
    # One transaction held both appends and the releases.
    assert commits == [(2, 2)]
    assert owner_columns(store_url, "a") == ("n1", 1, 0)
    assert owner_columns(store_url, "b") == ("n1", 1, 1)
    assert owner_columns(store_url, "c") == ("n2", taken.epoch, 1)
    # A group of releases alone commits too.
    (alone,) = store.append_batch([OwnerRelease("b", fences["b"])])
    assert alone is None and owner_columns(store_url, "b") == ("n1", 1, 0)
    for run_id in ("a", "b", "c"):
        assert_row_matches_log(store, run_id)


def test_unfenced_appends_and_ordinary_appends_leave_the_owner_alone(
    store: EventStore, store_url: str
) -> None:
    register(store, "n1")
    fence = store.owners.claim("r", "n1").fence
    _, view = store.append("r", [started()], EMPTY_VIEW, fence=fence)
    _, view = store.append("r", [ModelCallRequested(request_hash="sha256:r")], view, fence=fence)
    _, view = store.append(
        "r",
        [ModelCallCompleted(seq=1, response={}, usage=USAGE)],
        view,
    )
    store.append("r", [RunAbandoned(reason="operator")], view)  # an API-side append: unfenced
    assert owner_columns(store_url, "r") == ("n1", 1, 1)
    # A run made without a fence has no owner.
    store.append("u", [started()], EMPTY_VIEW)
    assert owner_columns(store_url, "u") == (None, 0, 0)


def test_a_creating_append_racing_another_claimers_loses_as_a_seq_conflict(
    store: EventStore, store_url: str
) -> None:
    register(store, "n1")
    register(store, "n2")
    one, two = store.owners.claim("r", "n1").fence, store.owners.claim("r", "n2").fence
    assert one == Fence("n1", 1) and two == Fence("n2", 1)
    store.append("r", [started()], EMPTY_VIEW, fence=one)
    with pytest.raises(SeqConflict):
        store.append("r", [started()], EMPTY_VIEW, fence=two)
    assert owner_columns(store_url, "r") == ("n1", 1, 1)


def test_lapsed_runs_names_runs_taken_over_or_ended(store: EventStore, store_url: str) -> None:
    register(store, "n1")
    register(store, "n2")
    fences, views = {}, {}
    for run_id in ("kept", "taken", "ended", "unwritten"):
        fences[run_id] = store.owners.claim(run_id, "n1").fence.epoch
    for run_id in ("kept", "taken", "ended"):
        _, views[run_id] = store.append(
            run_id, [started()], EMPTY_VIEW, fence=Fence("n1", fences[run_id])
        )
    store.owners.release("taken", Fence("n1", 1))
    store.owners.claim("taken", "n2")
    store.append("ended", [RunAbandoned(reason="operator")], views["ended"])
    assert store.owners.lapsed_runs("n1", fences) == ["ended", "taken"]
    assert store.owners.lapsed_runs("n1", {"kept": 2}) == ["kept"]
    assert store.owners.owned_by("n1") == ["ended", "kept"]
    assert store.owners.owned_by("n2") == ["taken"]
    assert set(store.owners.owners(["kept", "taken", "nothing"])) == {"kept", "taken"}


def test_orphans_are_the_active_runs_nobody_live_drives(store: EventStore, store_url: str) -> None:
    for node in ("me", "live", "lapsed", "stopped", "proven"):
        register(store, node)
    owned = {"mine": "me", "live": "live", "lapsed": "lapsed", "stopped": "stopped"}
    owned |= {"proven": "proven", "idle-live": "live", "done-lapsed": "lapsed"}
    for run_id, node in owned.items():
        store.append(run_id, [started()], EMPTY_VIEW, fence=store.owners.claim(run_id, node).fence)
    _, view = store.append("unowned", [started()], EMPTY_VIEW)  # a run made unfenced
    store.append("unowned-done", [started(), RunCompleted(output=1)], EMPTY_VIEW)
    store.owners.release("idle-live", Fence("live", 1))
    done = store.read_view("done-lapsed")
    store.append("done-lapsed", [RunCompleted(output=1)], done)
    lapse(store_url, "lapsed")
    store.owners.retire("stopped")

    orphans = store.owners.orphans("me", dead_nodes=["proven"])
    assert [o.run_id for o in orphans] == ["lapsed", "proven", "stopped", "unowned"]
    assert orphans[0] == RunOwner("lapsed", "lapsed", 1, True, False)
    assert orphans[3] == RunOwner("unowned", None, 0, False, False)
    # Without the proof, a live node's runs are its own; one page at a time.
    assert [o.run_id for o in store.owners.orphans("me")] == ["lapsed", "stopped", "unowned"]
    assert [o.run_id for o in store.owners.orphans("me", limit=1)] == ["lapsed"]
    # Another node sees this one's runs as its own: not orphaned while it lives.
    assert "mine" not in [o.run_id for o in store.owners.orphans("live")]
    assert view.next_seq == 1


def test_a_run_a_node_creates_is_its_own_from_its_first_event(
    store: EventStore, store_url: str
) -> None:
    register(store, "creator")
    register(store, "peer")
    # Created by a node that holds no drive of it yet (a start, a map item, a fork): owned in
    # the creating append's own transaction, not driven until its first claim.
    _, view = store.append("new", [started()], EMPTY_VIEW, fence=Fence.creating("creator"))
    assert owner_columns(store_url, "new") == ("creator", 0, 0)
    assert store.owners.orphans("peer") == []
    # A later append of the run carrying the creating mark is no fence at all: refused.
    with pytest.raises(Fenced):
        store.append("new", [RunCompleted(output=1)], view, fence=Fence("peer", 0))
    # Its first drive's claim takes it at epoch 1, as it took a run created unowned.
    assert store.owners.claim("new", "creator") == Claimed(Fence("creator", 1), None)
    assert owner_columns(store_url, "new") == ("creator", 1, 1)
    store.owners.release("new", Fence("creator", 1))
    # Once its creator is gone, it is an orphan like any run of a dead node.
    lapse(store_url, "creator")
    assert [o.run_id for o in store.owners.orphans("peer")] == ["new"]


def test_the_orphans_and_a_nodes_runs_are_read_from_their_indexes(store: EventStore) -> None:
    from sqlalchemy import Text, bindparam, text

    query = store.owners._orphans.text
    params = {"node_id": "me", "dead": ["x"], "limit": 200}
    prefix = "EXPLAIN QUERY PLAN " if store.dialect == "sqlite" else "EXPLAIN "
    explain = text(prefix + query).bindparams(bindparam("dead", expanding=True, type_=Text))
    with store._engine.connect() as connection:
        if store.dialect != "sqlite":
            # An empty table is read whole anyway; what matters is that the index can be used.
            connection.execute(text("SET LOCAL enable_seqscan = off"))
        plan = " ".join(str(row[-1]) for row in connection.execute(explain, params))
    assert "ix_runs_active" in plan, plan
    assert "SCAN r " not in plan.replace("SCAN r USING INDEX", ""), plan
    # A node's runs: read from their own index, in its order.
    owned = text(prefix + store.owners._owned_by.text)
    with store._engine.connect() as connection:
        if store.dialect != "sqlite":
            connection.execute(text("SET LOCAL enable_seqscan = off"))
        plan = " ".join(str(row[-1]) for row in connection.execute(owned, {"node_id": "n"}))
    assert "ix_runs_owner_node" in plan and "TEMP B-TREE" not in plan and "Sort" not in plan, plan


def test_a_version_6_store_keeps_its_runs_and_they_have_no_owner(store_url: str) -> None:
    from salvor.store import STORE_VERSION, normalize_store_url
    from sqlalchemy import create_engine, inspect, text

    with EventStore.open(store_url) as store:
        _, view = store.append("active", [started()], EMPTY_VIEW)
        store.append("active", [ModelCallRequested(request_hash="sha256:a")], view)
        store.append("done", [started(), RunCompleted(output=1)], EMPTY_VIEW)
        before = {run_id: store.read_log(run_id) for run_id in ("active", "done")}
    # What version 6 stored: no owner columns, no nodes table.
    engine = create_engine(normalize_store_url(store_url))
    with engine.begin() as connection:
        connection.execute(text("DROP INDEX ix_runs_owner_node"))
        for column in ("owner_node", "owner_epoch", "owner_driving"):
            connection.execute(text(f"ALTER TABLE runs DROP COLUMN {column}"))
        connection.execute(text("DROP TABLE nodes"))
        connection.execute(text("UPDATE store_meta SET value = 6"))
    engine.dispose()
    with EventStore.open(store_url) as store:
        assert {run_id: store.read_log(run_id) for run_id in before} == before
        for run_id in before:
            assert_row_matches_log(store, run_id)
        register(store, "n1")
        assert [o.run_id for o in store.owners.orphans("n1")] == ["active"]
        fence = store.owners.claim("active", "n1").fence
        assert fence == Fence("n1", 1)
        store.append("active", [RunAbandoned(reason="x")], store.read_view("active"), fence=fence)
    engine = create_engine(normalize_store_url(store_url))
    with engine.connect() as connection:
        indexes = {index["name"] for index in inspect(connection).get_indexes("runs")}
        version = connection.execute(text("SELECT value FROM store_meta")).scalar_one()
    engine.dispose()
    assert "ix_runs_owner_node" in indexes and version == STORE_VERSION


class Pause:
    """Holds a store's transaction just after it ran a statement starting with ``prefix``, until
    ``go`` (a real pause on the committing thread, with the statement's row locks held)."""

    def __init__(self, store: EventStore, prefix: str) -> None:
        from sqlalchemy import event

        self.reached, self.go = threading.Event(), threading.Event()

        @event.listens_for(store._engine, "after_cursor_execute")
        def hold(conn, cursor, statement, *args) -> None:
            if statement.startswith(prefix) and not self.go.is_set():
                self.reached.set()
                assert self.go.wait(30), "the paused transaction was never let go"


def in_thread(call) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def wait_for_lock_waiter(store: EventStore, statement_prefix: str) -> None:
    """Until a backend running ``statement_prefix`` waits on a lock (bounded)."""
    from sqlalchemy import text

    deadline = time.monotonic() + 30
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE :prefix"
    )
    while True:
        with store._engine.connect() as connection:
            if connection.execute(query, {"prefix": statement_prefix + "%"}).scalar_one():
                return
        assert time.monotonic() < deadline, f"nothing running {statement_prefix!r} ever waited"
        time.sleep(0.02)


def two_nodes(store_url: str) -> tuple[EventStore, EventStore]:
    if not store_url.startswith("postgresql"):
        pytest.skip("on SQLite every claim and renewal is one IMMEDIATE transaction: serial")
    first, second = EventStore.open(store_url), EventStore.open(store_url)
    register(first, "n1")
    register(second, "n2")
    fence = first.owners.claim("r", "n1").fence
    first.append("r", [started()], EMPTY_VIEW, fence=fence)
    return first, second


def test_a_renewal_waiting_on_a_takeover_fails_once_it_commits(store_url: str) -> None:
    # n1's lease holds when its renewal reads the row, but n2 is taking the run over (it proved
    # n1 dead) and holds that row: the renewal waits, and must then fail, never extend a lease
    # whose runs were just taken.
    first, second = two_nodes(store_url)
    try:
        pause = Pause(second, "UPDATE nodes SET stopped_at")
        claim, claimed = in_thread(lambda: second.owners.claim("r", "n2", dead_nodes=["n1"]))
        assert pause.reached.wait(30)
        renewal, renewed = in_thread(lambda: first.owners.renew("n1", LEASE))
        wait_for_lock_waiter(first, "UPDATE nodes SET lease_expires_at")
        pause.go.set()
        claim.join(30)
        renewal.join(30)
        assert claimed == [Claimed(Fence("n2", 2), None, taken_from="n1")]
        assert renewed == [False]
        with pytest.raises(Fenced):
            first.append(
                "r",
                [ModelCallRequested(request_hash="sha256:r")],
                first.read_view("r"),
                fence=Fence("n1", 1),
            )
    finally:
        first.close()
        second.close()


def test_a_takeover_waiting_on_a_renewal_loses_once_it_commits(store_url: str) -> None:
    # n1's lease has lapsed by the time n2 judges it, but n1's renewal (begun while it held) is
    # committing: the claim waits for it and then finds the lease renewed.
    first, second = two_nodes(store_url)
    try:
        first.owners.renew("n1", 1.0)
        pause = Pause(first, "UPDATE nodes SET lease_expires_at")
        renewal, renewed = in_thread(lambda: first.owners.renew("n1", LEASE))
        assert pause.reached.wait(30)
        # Until the lease it held before has lapsed by the database's clock.
        while second.owners.owner("r").node_live:
            time.sleep(0.05)
        claim, claimed = in_thread(lambda: second.owners.claim("r", "n2"))
        wait_for_lock_waiter(second, "UPDATE nodes SET stopped_at")
        pause.go.set()
        renewal.join(30)
        claim.join(30)
        assert renewed == [True]
        assert claimed == [Claimed(None, RunOwner("r", "n1", 1, True, True))]
        assert second.owners.owner("r") == RunOwner("r", "n1", 1, True, True)
    finally:
        first.close()
        second.close()


def test_drivers_taking_one_run_from_each_other_never_write_out_of_turn(store_url: str) -> None:
    # Four drivers, each a connection of its own, take one run from each other over and over
    # (each proves a peer dead at random, as a takeover sweep would) and append while they
    # believe they own it, reading the run afresh each time. Whatever the interleaving, the
    # log's epochs never go back, each epoch is one node's, and no append refused Fenced (or
    # any other way) is in the log.
    import random

    with EventStore.open(store_url) as store:
        store.append("r", [started()], EMPTY_VIEW)
    outcomes: list[tuple[str, object]] = []
    lock = threading.Lock()
    together = threading.Barrier(4)

    def driver(index: int) -> None:
        rng = random.Random(index)
        store = EventStore.open(store_url)
        generation, fence = 0, None
        node = f"d{index}.0"
        register(store, node)
        together.wait(30)
        try:
            for step in range(40):
                time.sleep(0.002)  # let the others in between any two steps
                if fence is None:
                    peers = [f"d{i}.{g}" for i in range(4) for g in range(8) if i != index]
                    try:
                        claimed = store.owners.claim("r", node, dead_nodes=[rng.choice(peers)])
                    except Fenced:  # a peer proved this node dead: start again as a new one
                        generation += 1
                        node = f"d{index}.{generation}"
                        register(store, node)
                        continue
                    fence = claimed.fence
                    if fence is None:
                        continue
                tag = f"sha256:{fence.node_id}:{fence.epoch}:{step}"
                view = store.read_view("r")
                batch = [
                    ModelCallRequested(request_hash=tag),
                    ModelCallCompleted(seq=view.next_seq, response={}, usage=USAGE),
                ]
                try:
                    store.append("r", batch, view, fence=fence)
                except (Fenced, SeqConflict) as refused:
                    with lock:
                        outcomes.append((tag, refused))
                    if isinstance(refused, Fenced):
                        fence = None
                else:
                    with lock:
                        outcomes.append((tag, None))
                if rng.random() < 0.2 and fence is not None:
                    store.owners.release("r", fence)
                    fence = None
        finally:
            store.close()

    threads = [threading.Thread(target=driver, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive()
    with EventStore.open(store_url) as store:
        log = store.read_log("r")
        assert_row_matches_log(store, "r")
    tags = [e.event.request_hash for e in log if isinstance(e.event, ModelCallRequested)]
    written = [(tag.split(":")[1], int(tag.split(":")[2])) for tag in tags]
    epochs = [epoch for _, epoch in written]
    assert epochs == sorted(epochs), written
    assert len(set(written)) == len(set(epochs)), written
    assert set(tags) == {tag for tag, refused in outcomes if refused is None}
    # Whether some driver was fenced depends on the interleaving (a loaded machine may run the
    # threads one after another); test_a_stale_fence_is_refused_* shows the refusal itself.
    assert len(set(epochs)) > 3, "the run hardly changed hands"


def test_nodes_lapsed_long_ago_are_forgotten_and_their_runs_stay_free(
    store: EventStore, store_url: str
) -> None:
    register(store, "old")
    register(store, "recent", lease=1)
    register(store, "live")
    store.append("r", [started()], EMPTY_VIEW, fence=store.owners.claim("r", "old").fence)
    lapse(store_url, "old")
    store.owners.retire("recent")
    assert store.owners.forget_nodes(3600) == 1
    assert {n.node_id for n in store.owners.nodes()} == {"recent", "live"}
    assert store.owners.owner("r") == RunOwner("r", "old", 1, True, False)
    assert [o.run_id for o in store.owners.orphans("live")] == ["r"]
    assert store.owners.claim("r", "live").fence == Fence("live", 2)
    with pytest.raises(ValueError):
        store.owners.forget_nodes(0)
