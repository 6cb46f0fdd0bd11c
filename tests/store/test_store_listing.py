"""Listing runs on real databases: pages newest first, the filters, a summary's keys, the forks of a
run and the census the daemon counts.
"""

from __future__ import annotations

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    GraphRunStarted,
    RunCompleted,
    RunStarted,
    Suspended,
    ToolCallCompleted,
    fork_head,
    plan_fork,
)
from salvor.store import AppendRequest, BadCursor, EventStore

from tests.support.graph_runs import PUBLISH_WRITE, published
from tests.support.store_records import pay, run_summary, started

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


def test_the_census_counts_runs_by_state_and_the_claims_held_open(store: EventStore) -> None:
    assert store.runs.census() == ({}, 0)
    _, view_a = store.append("a", [started()], EMPTY_VIEW)
    _, view_a = store.append("a", [pay("k")], view_a, claim="pay:k")
    store.append("b", [started(), RunCompleted(output=1)], EMPTY_VIEW)
    store.append("c", [started(), Suspended(reason="ok?", input_schema={})], EMPTY_VIEW)
    assert store.runs.census() == ({"awaiting_tool": 1, "completed": 1, "suspended": 1}, 1)
    store.append("a", [ToolCallCompleted(seq=1, output=7)], view_a, settle="pay:k")
    assert store.runs.census() == ({"running": 1, "completed": 1, "suspended": 1}, 0)
