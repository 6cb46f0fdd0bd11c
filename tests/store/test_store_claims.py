"""The store's claims on real databases: one run executes a write's identity, and a probe's
answer is kept per open write.
"""

from __future__ import annotations

import pytest
from salvor.protocol import EMPTY_VIEW, ToolCallCompleted
from salvor.store import ClaimHeld, EventStore

from tests.support.store_records import pay, started

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
