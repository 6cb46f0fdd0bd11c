"""``salvor graph run`` over the two example graphs in contrib/, offline (the demo model and the
demo tools), in this process: a gate parks the first until a person resumes it, and the second
maps its agent over every ticket and folds the answers. The same store, read back, holds every
call once."""

from __future__ import annotations

import json
from pathlib import Path

from salvor.daemon.agents import load_definition
from salvor.daemon.tools import demo_registry
from salvor.protocol import EventKind, parse_graph_json
from salvor.store import EventStore

from tests.support.cli import salvor_in_process

CONTRIB = Path(__file__).resolve().parents[3] / "contrib"


def _env(tmp_path: Path, store_url: str) -> dict[str, str]:
    # Both backends: the command drives whichever store it is pointed at.
    return {
        "SALVOR_STORE": store_url,
        "SALVOR_DEMO_EFFECTS": str(tmp_path / "effects.jsonl"),
        "PATH": "/usr/bin:/bin",
    }


def _graph_run(tmp_path: Path, store_url: str, name: str, *agents: str) -> tuple[str, str]:
    graph = CONTRIB / "graphs" / f"{name}.json"
    run_input = (CONTRIB / "graphs" / f"{name}.input.json").read_text()
    flags = [arg for agent in agents for arg in ("--agent", str(CONTRIB / "agents" / agent))]
    done = salvor_in_process(
        "graph", "run", str(graph), "--input", run_input, *flags, env=_env(tmp_path, store_url)
    )
    assert done.returncode == 0, done.stderr
    run_id, sentence = done.stdout.splitlines()
    return run_id, sentence


def _kinds(store_url: str, run_id: str) -> list[str]:
    with EventStore.open(store_url) as store:
        return [envelope.kind for envelope in store.read_log(run_id)]


def test_the_publishing_graph_waits_at_its_gate_and_publishes_once_approved(
    tmp_path: Path, store_url: str
) -> None:
    run_id, sentence = _graph_run(tmp_path, store_url, "publish", "researcher.toml", "drafter.toml")
    assert "suspended, waiting on a person: Publish this post?" in sentence

    refused = salvor_in_process(
        "resume", run_id, "--input", '{"approved": "yes"}', env=_env(tmp_path, store_url)
    )
    assert refused.returncode != 0 and "gate 'approve'" in refused.stderr
    approved = salvor_in_process(
        "resume", run_id, "--input", '{"approved": true}', env=_env(tmp_path, store_url)
    )
    assert approved.returncode == 0, approved.stderr
    assert f"run {run_id} completed" in approved.stdout and '"publish"' in approved.stdout

    kinds = _kinds(store_url, run_id)
    assert kinds[0] == EventKind.GRAPH_RUN_STARTED and kinds[-1] == EventKind.RUN_COMPLETED
    assert kinds.count(EventKind.RESUMED) == 1  # the refused approval recorded nothing
    assert kinds.count(EventKind.NODE_SKIPPED) == 1  # tell_author: the other case
    posts = (tmp_path / "effects.jsonl").read_text().splitlines()
    assert [json.loads(line)["tool"] for line in posts] == ["publish_post"]


def test_the_ticket_graph_maps_its_agent_over_every_ticket_and_folds_the_answers(
    tmp_path: Path, store_url: str
) -> None:
    run_id, sentence = _graph_run(tmp_path, store_url, "tickets", "ticket-triage.toml")
    tickets = json.loads((CONTRIB / "graphs" / "tickets.input.json").read_text())["tickets"]
    # The demo model estimates every ticket at 1 minute (its placeholder for an integer).
    expected = {"minutes": len(tickets), "tickets": len(tickets)}
    assert sentence == f"run {run_id} completed: {json.dumps(expected)}"
    kinds = _kinds(store_url, run_id)
    assert kinds.count(EventKind.MAP_ITEM_COMPLETED) == len(tickets)


def test_the_example_graphs_name_the_example_agents_as_they_are_now() -> None:
    hashes = {
        load_definition(str(path), known_tools=demo_registry().names()).agent_def_hash
        for path in (CONTRIB / "agents").glob("*.toml")
    }
    for path in (CONTRIB / "graphs").glob("*.json"):
        if path.name.endswith(".input.json"):
            continue
        graph = parse_graph_json(path.read_bytes())
        named = {node.agent for node in graph.nodes if node.agent is not None}
        named |= {node.body.agent for node in graph.nodes if node.body is not None}
        assert named - {None} <= hashes, path.name


def test_a_graph_run_with_a_label_only_the_daemon_writes_is_refused_before_anything_is_stored(
    tmp_path: Path, store_url: str
) -> None:
    EventStore.open(store_url).close()
    refused = salvor_in_process(
        "graph",
        "run",
        str(CONTRIB / "graphs" / "tickets.json"),
        "--agent",
        str(CONTRIB / "agents" / "ticket-triage.toml"),
        "--label",
        "salvor.map_of=someone-elses-graph",
        env=_env(tmp_path, store_url),
    )
    assert refused.returncode == 2
    assert "`salvor.map_of` is written by the daemon alone" in refused.stderr
    with EventStore.open(store_url) as store:
        assert store.definitions.list_agents() == [] and store.definitions.list_graphs() == []
        assert store.list_runs(limit=10)[0] == []
