"""What a pinned agent node asks of a call: its baseline is a file, so a graph with one runs only
as a flow run with its files (a client that sends none is told to update), and its baseline path
is the flow's baseline directory and the node's id."""

from __future__ import annotations

from salvor.daemon.graphs import files_not_sent
from salvor.daemon.graphs._pinned_baseline import calls_baseline_path
from salvor.protocol import FlowBundle, graph_from_value, names_files

AGENT = "sha256:" + "a" * 64


def _graph(**fields):
    node = {"id": "answer", "kind": "agent", "agent": AGENT, **fields}
    return graph_from_value({"schema_version": 1, "nodes": [node], "edges": []})


def test_a_pinned_node_by_hash_needs_the_files_of_a_flow_run() -> None:
    assert not names_files(_graph().nodes)
    assert files_not_sent(_graph().nodes) is None
    pinned = _graph(pinned=True)
    assert names_files(pinned.nodes)
    refusal = files_not_sent(pinned.nodes)
    assert refusal is not None
    assert refusal.startswith("node 'answer' is an agent pinned to its baseline: ")
    assert "update the salvor client" in refusal


def test_the_calls_baseline_lies_beside_the_snapshots_under_the_node_id() -> None:
    bundle = FlowBundle(
        path="/p/.salvor/flows/main.yaml",
        canonical="/p/.salvor/flows/main.yaml",
        spelling={"state": "listed"},
        document="sha256:" + "b" * 64,
        members={},
    )
    assert calls_baseline_path(bundle, "answer") == (
        "/p/.salvor/flows/__baselines__/main/answer.calls.json"
    )
    nested = FlowBundle(**{**bundle.to_json(), "members": {}, "stem": "inner"})
    assert calls_baseline_path(nested, "answer") == (
        "/p/.salvor/flows/__baselines__/inner/answer.calls.json"
    )
