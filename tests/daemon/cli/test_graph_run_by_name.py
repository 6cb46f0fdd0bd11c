"""``salvor graph run NAMESPACE/NAME``: a run of a flow kept by name in the local store, on both
backends, walking the name's current version and labelled with it; a name kept by nothing, with
no file there either, is one sentence and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

from salvor.protocol import parse_graph_json
from salvor.store import EventStore

from tests.support.cli import salvor_in_process

GATE = {"schema_version": 1, "nodes": [{"id": "ok", "kind": "gate", "prompt": "Go?"}], "edges": []}
OTHER = {**GATE, "nodes": [{"id": "ok", "kind": "gate", "prompt": "Go now?"}]}


def _keep(store_url: str, *documents: dict) -> list[str]:
    """Keep each document as the next version of team/triage; their hashes."""
    hashes = []
    with EventStore.open(store_url) as store:
        for document in documents:
            graph = parse_graph_json(json.dumps(document).encode())
            store.definitions.put_graph(
                graph.hash, document=graph.document, summary=graph.summary()
            )
            store.named_flows.name("team", "triage", graph.hash, run_id=None)
            hashes.append(graph.hash)
    return hashes


def test_a_flow_is_run_by_its_name_at_its_current_version(tmp_path: Path, store_url: str) -> None:
    _, current = _keep(store_url, GATE, OTHER)
    env = {"SALVOR_STORE": store_url, "PATH": "/usr/bin:/bin"}
    done = salvor_in_process(
        "graph", "run", "team/triage", "--label", "who=me", env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    run_id, sentence = done.stdout.splitlines()
    assert "suspended, waiting on a person: Go now?" in sentence
    with EventStore.open(store_url) as store:
        (summary,) = [run for run in store.list_runs()[0] if run.run_id == run_id]
    assert summary.graph_hash == current
    assert summary.labels == {"who": "me", "salvor.flow": "team/triage"}


def test_a_name_kept_by_nothing_is_one_sentence(tmp_path: Path, store_url: str) -> None:
    env = {"SALVOR_STORE": store_url, "PATH": "/usr/bin:/bin"}
    done = salvor_in_process("graph", "run", "team/nothing", env=env, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "no flow is kept as 'team/nothing'" in done.stderr
    assert "Traceback" not in done.stderr
