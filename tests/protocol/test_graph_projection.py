"""The per-node projection of a graph run (``project_graph``): one table of (log, graph?, answer).

Each case is a legal log (checked through the append guard) and the whole answer it projects to,
so absence is pinned as exactly as presence. Illegal logs and agent runs project without raising.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from salvor.protocol import (
    GraphRunStarted,
    MapItemCompleted,
    NodeEntered,
    NodeExited,
    NodeSkipped,
    graph_from_value,
    project_graph,
)

from tests.protocol.graphs import publishing
from tests.support.graph_runs import (
    GRAPH,
    RUN_INPUT,
    SKIP_REASON,
    agent_run,
    legal,
    published,
    wrap,
)

GRAPH_DOCUMENT = graph_from_value(publishing())
ORIGIN = {
    "run_id": "origin",
    "through_seq": 18,
    "from_node": "publish",
    "graph_hash": GRAPH,
    "acknowledged_writes": [20],
}
EXITED_BEFORE_PUBLISH = [
    {"node": "research", "state": "exited"},
    {"node": "draft", "state": "exited"},
    {"node": "approve", "state": "exited"},
    {"node": "route", "state": "exited", "branch_case": "true"},
]
WHOLE = [
    *EXITED_BEFORE_PUBLISH,
    {"node": "publish", "state": "exited"},
    {"node": "cool_off", "state": "skipped", "reason": SKIP_REASON},
    {"node": "each", "state": "exited", "map": {"items": 2, "completed": 2}},
    {"node": "tally", "state": "exited"},
]


@dataclass(frozen=True)
class Case:
    name: str
    events: list
    nodes: list
    current_node: str | None = None
    with_graph: bool = True
    forked_from: dict | None = None


def _map_open(completed: list[int], items: list | None = None) -> list:
    items = RUN_INPUT["tickets"] if items is None else items
    return [
        GraphRunStarted(graph_hash=GRAPH, input=RUN_INPUT),
        NodeEntered(node="each", input=items),
        *(MapItemCompleted(node="each", index=i, run_id=f"child-{i}", output=i) for i in completed),
    ]


CASES = [
    Case("just started: no node reached", published()[:1], []),
    Case(
        "inside an agent node's model call",
        published()[:3],
        [{"node": "research", "state": "entered"}],
        current_node="research",
    ),
    Case(
        "parked at a gate",
        published()[:15],
        [*EXITED_BEFORE_PUBLISH[:2], {"node": "approve", "state": "entered"}],
        current_node="approve",
    ),
    Case(
        "between nodes: no current node",
        published()[:19],
        EXITED_BEFORE_PUBLISH,
    ),
    Case("a whole walk, a branch's case and a skip", published(), WHOLE),
    Case(
        "a map with one item of two finished, out of order",
        _map_open([1]),
        [{"node": "each", "state": "entered", "map": {"items": 2, "completed": 1}}],
        current_node="each",
    ),
    Case(
        "a map entered, no item finished: the graph says it is a map",
        _map_open([]),
        [{"node": "each", "state": "entered", "map": {"items": 2, "completed": 0}}],
        current_node="each",
    ),
    Case(
        "a map entered, no item finished, no graph at hand: no map progress claimed",
        _map_open([]),
        [{"node": "each", "state": "entered"}],
        current_node="each",
        with_graph=False,
    ),
    Case(
        "a map's item without the graph at hand: the log says it is a map",
        _map_open([0]),
        [{"node": "each", "state": "entered", "map": {"items": 2, "completed": 1}}],
        current_node="each",
        with_graph=False,
    ),
    Case(
        "a map over an empty list",
        [*_map_open([], items=[]), NodeExited(node="each", output=[])],
        [{"node": "each", "state": "exited", "map": {"items": 0, "completed": 0}}],
    ),
    Case(
        "a fork names its origin",
        [
            GraphRunStarted(graph_hash=GRAPH, input=RUN_INPUT, forked_from=ORIGIN),
            *published()[1:19],
        ],
        EXITED_BEFORE_PUBLISH,
        forked_from=ORIGIN,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_projection(case: Case) -> None:
    graph = GRAPH_DOCUMENT if case.with_graph else None
    expected: dict[str, Any] = {"graph_hash": GRAPH}
    if case.current_node is not None:
        expected["current_node"] = case.current_node
    expected["nodes"] = case.nodes
    if case.forked_from is not None:
        expected["forked_from"] = case.forked_from
    assert project_graph(GRAPH, legal(case.events), graph=graph) == expected


def test_the_key_order_is_the_spec_s() -> None:
    body = project_graph(GRAPH, legal(published()[:3]))
    assert list(body) == ["graph_hash", "current_node", "nodes"]
    whole = project_graph(GRAPH, legal(published()), graph=GRAPH_DOCUMENT)
    assert [list(node) for node in whole["nodes"]][3] == ["node", "state", "branch_case"]


ILLEGAL = {
    "exited without being entered": [NodeExited(node="x", output=1)],
    "an item of a node never entered": [MapItemCompleted(node="m", index=0, run_id="c", output=1)],
    "entered twice": [NodeEntered(node="x", input=[1]), NodeEntered(node="x", input=None)],
    "skipped after it was entered": [
        NodeEntered(node="x", input=None),
        NodeSkipped(node="x", reason="r"),
    ],
    "one item recorded twice": [
        NodeEntered(node="each", input=[1, 2]),
        MapItemCompleted(node="each", index=0, run_id="c", output=1),
        MapItemCompleted(node="each", index=0, run_id="c", output=1),
    ],
}


@pytest.mark.parametrize("events", ILLEGAL.values(), ids=list(ILLEGAL))
def test_an_illegal_log_still_projects(events: list) -> None:
    body = project_graph(GRAPH, wrap([GraphRunStarted(graph_hash=GRAPH, input=None), *events]))
    assert body["graph_hash"] == GRAPH and isinstance(body["nodes"], list)


def test_one_item_recorded_twice_counts_once() -> None:
    events = [GraphRunStarted(graph_hash=GRAPH, input=None), *ILLEGAL["one item recorded twice"]]
    (node,) = project_graph(GRAPH, wrap(events))["nodes"]
    assert node["map"] == {"items": 2, "completed": 1}


def test_an_agent_run_or_nothing_projects_to_no_node() -> None:
    assert project_graph(GRAPH, legal(agent_run())) == {"graph_hash": GRAPH, "nodes": []}
    assert project_graph(GRAPH, []) == {"graph_hash": GRAPH, "nodes": []}
