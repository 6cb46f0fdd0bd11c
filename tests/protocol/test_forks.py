"""Fork planning (``plan_fork``, ``fork_head``): the hazard matrix and every refusal, as tables.

The origin is ``published()``: a read in research (seq 4), a write (8) and an idempotent call
(10) in draft, a write (20) in publish. A write is a hazard exactly when it lies after the fork
node's entry; a read or an idempotent call never is.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    Envelope,
    ErrorCode,
    ForkRefused,
    GraphRunStarted,
    NodeEntered,
    RunAbandoned,
    RunStarted,
    RunState,
    ToolCallCompleted,
    ToolCallRequested,
    check_next,
    fold,
    fork_head,
    plan_fork,
    step,
)

from tests.support.graph_runs import (
    DRAFT_WRITE,
    ENTERED_AT,
    GRAPH,
    IDEMPOTENT_SEQ,
    PUBLISH_WRITE,
    READ_SEQ,
    RUN_INPUT,
    agent_run,
    legal,
    published,
    wrap,
)

ORIGIN = legal(published())


@dataclass(frozen=True)
class Hazard:
    name: str
    from_node: str
    acknowledged: tuple[int, ...]
    writes: tuple[int, ...]
    unacknowledged: tuple[int, ...]


HAZARDS = [
    Hazard("from the first node: every write", "research", (), (8, 20), (8, 20)),
    Hazard("the write's own node is re-walked", "draft", (), (8, 20), (8, 20)),
    Hazard("a write before the fork node is no hazard", "approve", (), (20,), (20,)),
    Hazard("from the writing tool node", "publish", (), (20,), (20,)),
    Hazard("after every write: nothing to acknowledge", "each", (), (), ()),
    Hazard("acknowledged in part: narrowed", "research", (8,), (8, 20), (20,)),
    Hazard("acknowledged in full: proceeds", "draft", (20, 8), (8, 20), ()),
    Hazard("an acknowledgement given twice counts once", "publish", (20, 20), (20,), ()),
]


@pytest.mark.parametrize("case", HAZARDS, ids=lambda case: case.name)
def test_hazard_matrix(case: Hazard) -> None:
    plan = plan_fork(ORIGIN, case.from_node, case.acknowledged)
    assert tuple(w.seq for w in plan.writes) == case.writes
    assert tuple(w.seq for w in plan.unacknowledged) == case.unacknowledged
    assert plan.would_proceed is (not case.unacknowledged)
    assert plan.through_seq == ENTERED_AT[case.from_node] - 1
    assert plan.prefix == tuple(ORIGIN[: ENTERED_AT[case.from_node]])
    # Reads and idempotent calls are never listed, wherever they are.
    assert not {READ_SEQ, IDEMPOTENT_SEQ} & {w.seq for w in plan.writes}
    if case.unacknowledged:
        with pytest.raises(ForkRefused) as refused:
            plan.check_proceeds()
        assert refused.value.code is ErrorCode.WRITE_REPLAY_HAZARD
        assert refused.value.status == 409
        listed = refused.value.details["writes"]
        assert [w["seq"] for w in listed] == list(case.unacknowledged)
    else:
        plan.check_proceeds()


def test_a_listed_write_is_the_recorded_intent() -> None:
    (write,) = plan_fork(ORIGIN, "publish").writes
    assert write.to_json() == {
        "seq": PUBLISH_WRITE,
        "tool": "publish_post",
        "input": {"text": "draft one"},
        "idempotency_key": None,
        "recorded_at": ORIGIN[PUBLISH_WRITE].recorded_at,
    }


def test_the_dry_run_body() -> None:
    plan = plan_fork(ORIGIN, "draft", [DRAFT_WRITE])
    assert plan.dry_run_json() == {
        "dry_run": True,
        "origin": "origin",
        "from_node": "draft",
        "through_seq": 6,
        "graph_hash": GRAPH,
        "prefix_event_count": 7,
        "writes": [w.to_json() for w in plan.writes],
        "unacknowledged_writes": [PUBLISH_WRITE],
        "would_proceed": False,
    }


def _parked() -> list[Envelope]:
    # The origin cut inside publish's write: its intent recorded, no completion.
    return legal(published()[: PUBLISH_WRITE + 1])


@dataclass(frozen=True)
class Refusal:
    name: str
    log: list[Envelope]
    from_node: str
    acknowledged: tuple[int, ...]
    code: ErrorCode


REFUSALS = [
    Refusal("an agent run", legal(agent_run()), "research", (), ErrorCode.NOT_A_GRAPH_RUN),
    Refusal("an empty log", [], "research", (), ErrorCode.NOT_A_GRAPH_RUN),
    Refusal("a node not in the graph", ORIGIN, "ghost", (), ErrorCode.INVALID_FORK_NODE),
    Refusal("a node the walk skipped", ORIGIN, "cool_off", (), ErrorCode.INVALID_FORK_NODE),
    Refusal(
        "a node not reached yet",
        legal(published()[:12]),
        "approve",
        (),
        ErrorCode.INVALID_FORK_NODE,
    ),
    Refusal(
        "parked at a dangling write",
        _parked(),
        "publish",
        (),
        ErrorCode.ORIGIN_NEEDS_RECONCILIATION,
    ),
    Refusal(
        "parked: before the node is even looked up",
        _parked(),
        "ghost",
        (),
        ErrorCode.ORIGIN_NEEDS_RECONCILIATION,
    ),
    Refusal(
        "acknowledging a write before the fork node",
        ORIGIN,
        "publish",
        (DRAFT_WRITE, PUBLISH_WRITE),
        ErrorCode.BAD_REQUEST,
    ),
    Refusal("acknowledging a read", ORIGIN, "research", (READ_SEQ,), ErrorCode.BAD_REQUEST),
    Refusal(
        "acknowledging an idempotent call",
        ORIGIN,
        "research",
        (IDEMPOTENT_SEQ,),
        ErrorCode.BAD_REQUEST,
    ),
    Refusal("acknowledging a seq past the log", ORIGIN, "research", (99,), ErrorCode.BAD_REQUEST),
]


@pytest.mark.parametrize("case", REFUSALS, ids=lambda case: case.name)
def test_refusals(case: Refusal) -> None:
    with pytest.raises(ForkRefused) as refused:
        plan_fork(case.log, case.from_node, case.acknowledged)
    assert refused.value.code is case.code
    assert refused.value.status == case.code.status


def test_details_of_the_refusals() -> None:
    with pytest.raises(ForkRefused) as parked:
        plan_fork(_parked(), "publish")
    intent = parked.value.details["intent"]
    assert intent["seq"] == PUBLISH_WRITE and intent["tool"] == "publish_post"
    assert intent["recorded_at"] == ORIGIN[PUBLISH_WRITE].recorded_at
    with pytest.raises(ForkRefused) as stray:
        plan_fork(ORIGIN, "publish", [DRAFT_WRITE, READ_SEQ, PUBLISH_WRITE])
    assert stray.value.details == {"not_writes": [READ_SEQ, DRAFT_WRITE]}
    assert f"seq {READ_SEQ}, {DRAFT_WRITE}" in stray.value.message
    with pytest.raises(ForkRefused) as unknown:
        plan_fork(ORIGIN, "ghost")
    assert unknown.value.details["entered"] == list(ENTERED_AT)


def test_an_abandoned_dangling_write_is_a_hazard_once_abandoned() -> None:
    # Abandoned, the write's outcome is still unknown: a fork re-walking it must be told.
    log = legal(
        [
            *published()[: PUBLISH_WRITE + 1],
            RunAbandoned(
                reason="gave up", unresolved_write={"seq": PUBLISH_WRITE, "tool": "publish_post"}
            ),
        ]
    )
    plan = plan_fork(log, "publish")
    assert [w.seq for w in plan.unacknowledged] == [PUBLISH_WRITE]


@pytest.mark.parametrize("from_node", list(ENTERED_AT))
def test_the_child_s_log_is_the_prefix_under_its_own_head(from_node: str) -> None:
    plan = plan_fork(ORIGIN, from_node, _acknowledgeable(from_node))
    events = fork_head(plan)
    head = events[0]
    assert head.graph_hash == GRAPH and head.input == RUN_INPUT and head.labels is None
    assert head.forked_from == {
        "run_id": "origin",
        "through_seq": plan.through_seq,
        "from_node": from_node,
        "graph_hash": GRAPH,
        "acknowledged_writes": list(plan.acknowledged),
    }
    assert events[1:] == [envelope.event for envelope in ORIGIN[1 : plan.through_seq + 1]]
    # The child's log is legal, ends between nodes, and the fork node may be entered next.
    view = EMPTY_VIEW
    for seq, event in enumerate(events):
        envelope = Envelope(
            run_id="child",
            seq=seq,
            schema_version=1,
            recorded_at="2026-02-01T00:00:00Z",
            event=event,
        )
        check_next(view, envelope)
        view = step(view, envelope)
    assert view.state is RunState.RUNNING and view.pending is None and view.open_node is None
    assert view.forked_from == head.forked_from
    assert view.next_seq == plan.through_seq + 1 == len(plan.prefix)
    entered = ORIGIN[plan.through_seq + 1]
    assert isinstance(entered.event, NodeEntered) and entered.event.node == from_node
    check_next(
        view,
        Envelope(
            run_id="child",
            seq=view.next_seq,
            schema_version=1,
            recorded_at="2026-02-01T00:00:01Z",
            event=entered.event,
        ),
    )


def _acknowledgeable(from_node: str) -> list[int]:
    return [seq for seq in (DRAFT_WRITE, PUBLISH_WRITE) if seq >= ENTERED_AT[from_node]]


def test_labels_travel_with_the_fork() -> None:
    log = legal(published(labels={"build": "42"}))
    (head, *_) = fork_head(plan_fork(log, "draft", [DRAFT_WRITE, PUBLISH_WRITE]))
    assert head.labels == {"build": "42"}


def test_a_fork_of_a_fork_names_its_own_origin() -> None:
    child = fork_head(plan_fork(ORIGIN, "publish", [PUBLISH_WRITE]))
    grandchild = fork_head(plan_fork(legal(child, "child"), "route"))
    assert grandchild[0].forked_from["run_id"] == "child"
    assert fold(legal(grandchild, "grandchild")).forked_from["from_node"] == "route"


def test_a_log_not_between_nodes_at_the_cut_is_not_forked() -> None:
    # Not a log the guard lets through (a node entered while a read is open): forking it would
    # hand the child an open intent inside its prefix, so it is refused instead.
    log = wrap(
        [
            GraphRunStarted(graph_hash=GRAPH, input=None),
            ToolCallRequested(tool="lookup", input={}, effect="read", idempotency_key=None),
            NodeEntered(node="research", input=None),
        ]
    )
    with pytest.raises(ForkRefused) as refused:
        plan_fork(log, "research")
    assert refused.value.code is ErrorCode.DIVERGENCE
    assert "not between two nodes at seq 1" in refused.value.message


def _item_logs() -> list[list[Envelope]]:
    """The two items of ``each``: the first wrote, the second only read."""
    wrote = [
        RunStarted(agent_def_hash="sha256:" + "a" * 64, input={"minutes": 3}),
        ToolCallRequested(tool="log_minutes", input={"n": 3}, effect="write", idempotency_key=None),
        ToolCallCompleted(seq=1, output={"ok": True}),
    ]
    read = [
        RunStarted(agent_def_hash="sha256:" + "a" * 64, input={"minutes": 4}),
        ToolCallRequested(tool="lookup", input={}, effect="read", idempotency_key=None),
        ToolCallCompleted(seq=1, output={}),
    ]
    return [legal(wrote, "item-0"), legal(read, "item-1")]


EACH = ENTERED_AT["each"]
MAP_ITEMS = {EACH: _item_logs()}


@pytest.mark.parametrize(
    ("from_node", "acknowledged", "writes", "unacknowledged"),
    [
        ("research", (), (8, 20, EACH), (8, 20, EACH)),
        ("research", (8, 20), (8, 20, EACH), (EACH,)),
        ("each", (), (EACH,), (EACH,)),
        ("each", (EACH,), (EACH,), ()),
        ("tally", (), (), ()),
    ],
)
def test_a_map_item_s_write_is_a_hazard_under_its_map_s_entry(
    from_node: str, acknowledged: tuple, writes: tuple, unacknowledged: tuple
) -> None:
    plan = plan_fork(ORIGIN, from_node, acknowledged, map_items=MAP_ITEMS)
    assert tuple(w.seq for w in plan.writes) == writes
    assert tuple(w.seq for w in plan.unacknowledged) == unacknowledged


def test_a_map_item_s_write_names_its_run() -> None:
    (item,) = plan_fork(ORIGIN, "each", map_items=MAP_ITEMS).writes
    assert item.to_json() == {
        "seq": EACH,
        "tool": "log_minutes",
        "input": {"n": 3},
        "idempotency_key": None,
        "recorded_at": MAP_ITEMS[EACH][0][1].recorded_at,
        "run": "item-0",
        "run_seq": 1,
    }
    # A map copied with the prefix is not walked again: its entry acknowledges nothing.
    with pytest.raises(ForkRefused) as refused:
        plan_fork(ORIGIN, "tally", [EACH], map_items=MAP_ITEMS)
    assert refused.value.code is ErrorCode.BAD_REQUEST
