"""Run ownership in the store: node leases on the database's clock, claims as compare-and-set,
and fenced appends, on SQLite and PostgreSQL.

A lease is made to lapse by writing its expiry into the past behind the store's back (never by
waiting), so no test depends on how fast the machine is.
"""

from __future__ import annotations

import re

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
    RunOwner,
    SeqConflict,
)

from tests.store.test_store import assert_row_matches_log, execute_sql

LEASE = 30.0
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


def test_unfenced_appends_and_ordinary_appends_leave_the_owner_alone(
    store: EventStore, store_url: str
) -> None:
    register(store, "n1")
    fence = store.owners.claim("r", "n1").fence
    _, view = store.append("r", [started()], EMPTY_VIEW, fence=fence)
    _, view = store.append("r", [ModelCallRequested(request_hash="sha256:r")], view, fence=fence)
    _, view = store.append(
        "r",
        [ModelCallCompleted(seq=1, response={}, usage={"input_tokens": 1, "output_tokens": 1})],
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
