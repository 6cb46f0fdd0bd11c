"""``salvor graph run NAMESPACE/NAME``: a run of a flow kept by name in the local store (or, with
``--remote``, in that daemon's), on both backends, walking the name's current version and
labelled with it; a name kept by nothing, with no file there either, is one sentence and a
non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from salvor.protocol import parse_graph_json
from salvor.store import EventStore

from tests.daemon.cli.test_flow_remote import remote  # noqa: F401 (the fixture)
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


def test_a_flow_kept_by_a_remote_daemon_is_run_there_by_its_name(
    tmp_path: Path,
    remote,  # noqa: F811
) -> None:
    url = remote.daemon.base_url
    with httpx.Client(base_url=url, timeout=30) as client:
        kept = client.post("/v1/graphs", params={"name": "team/triage"}, json=OTHER)
        assert kept.status_code == 201, kept.text
        env = {"PATH": "/usr/bin:/bin"}
        done = salvor_in_process(
            "graph", "run", "team/triage", "--remote", url, "--input", '"x"', env=env, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        # The run's id, a line per node, then where the run rests.
        lines = done.stdout.splitlines()
        run_id, sentence = lines[0], lines[-1]
        assert "suspended, waiting on a person: Go now?" in sentence
        body = client.get(f"/v1/runs/{run_id}").json()
        assert body["graph_hash"] == kept.json()["graph"]
        assert body["labels"]["salvor.flow"] == "team/triage"
        unknown = salvor_in_process(
            "graph", "run", "team/nothing", "--remote", url, env=env, cwd=tmp_path
        )
        assert unknown.returncode == 1 and "unknown_flow" in unknown.stderr, unknown.stderr
