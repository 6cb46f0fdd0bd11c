"""Snapshots and baselines: a flow run that updates its baselines writes them beside the flow file
by the client's rules; a run that compares makes the same model calls and fails on a change.

The agent is aimed at the scripted provider (a real HTTP server); the command runs in this
process over a real store and a real project in a temporary directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.chaos.test_kill_serve import agent_toml
from tests.support.cli import salvor_in_process
from tests.support.scripted_provider import ProviderCall, ScriptedProvider

FLOW = """\
schema_version: 1
nodes:
  - {id: answer, kind: agent, agent_file: ../../agents/echo.toml}
  - {id: check, kind: snapshot, name: reply, of: $nodes.answer}
  - {id: nested, kind: flow, flow: inner}
edges:
  - {from: answer, to: check}
"""

INNER = """\
schema_version: 1
nodes:
  - {id: given, kind: snapshot, name: given, of: $input}
edges: []
"""


def _echo(call: ProviderCall):
    text = call.request["messages"][0]["content"][0]["text"]
    answer = {"model": call.request["model"], "content": [{"type": "text", "text": text}]}
    return {**answer, "stop_reason": "end_turn"}, {"input_tokens": 3, "output_tokens": 2}


def _project(tmp_path: Path, base_url: str) -> Path:
    project = tmp_path / "proj"
    flows = project / ".salvor" / "flows"
    flows.mkdir(parents=True)
    (project / "agents").mkdir()
    (project / "agents" / "echo.toml").write_text(agent_toml(base_url, name="echo", tools=[]))
    (flows / "main.yaml").write_text(FLOW)
    (flows / "inner.yaml").write_text(INNER)
    return project


def _run(project: Path, store_url: str, run_input: str, *flags: str):
    return salvor_in_process(
        "graph",
        "run",
        str(project / ".salvor" / "flows" / "main.yaml"),
        "--input",
        run_input,
        *flags,
        env={"SALVOR_STORE": store_url, "PATH": "/usr/bin:/bin"},
    )


def test_update_then_compare_makes_the_same_calls_and_a_change_fails_naming_the_snapshot(
    tmp_path: Path, store_url: str
) -> None:
    with ScriptedProvider(_echo) as provider:
        project = _project(tmp_path, provider.base_url)
        baselines = project / ".salvor" / "flows" / "__baselines__"
        missing = _run(project, store_url, '"hello"')
        assert missing.returncode == 3 and "snapshot 'reply' has no baseline at" in missing.stdout
        first = len(provider.calls)

        updated = _run(project, store_url, '"hello"', "--update-baselines")
        assert updated.returncode == 0, updated.stderr
        assert json.loads((baselines / "main" / "reply.json").read_text()) == "hello"
        # A nested flow's baselines lie under the id of the node that runs it.
        assert json.loads((baselines / "nested" / "given.json").read_text()) == "hello"
        update_calls = [call.request_hash for call in provider.calls[first:]]
        assert update_calls, "the update run asked the model"
        before = len(provider.calls)

        compared = _run(project, store_url, '"hello"')
        assert compared.returncode == 0, compared.stdout + compared.stderr
        compare_calls = [call.request_hash for call in provider.calls[before:]]
        assert compare_calls == update_calls

        changed = _run(project, store_url, '"goodbye"')
        assert changed.returncode == 3
        assert (
            "node 'check': snapshot 'reply' differs from its baseline "
            f"{os.path.realpath(baselines)}/main/reply.json: at $ the baseline has "
            '"hello", the run "goodbye"'
        ) in changed.stdout


def test_a_baseline_directory_that_is_a_link_is_not_written_and_the_command_fails(
    tmp_path: Path, store_url: str
) -> None:
    with ScriptedProvider(_echo) as provider:
        project = _project(tmp_path, provider.base_url)
        baselines = project / ".salvor" / "flows" / "__baselines__"
        baselines.mkdir()
        (tmp_path / "elsewhere").mkdir()
        (baselines / "main").symlink_to(tmp_path / "elsewhere")
        updated = _run(project, store_url, '"hello"', "--update-baselines")
    assert updated.returncode == 1
    assert "baseline not written: " in updated.stderr and "reply.json" in updated.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert json.loads((baselines / "nested" / "given.json").read_text()) == "hello"


TWICE = """\
schema_version: 1
nodes:
  - {id: first, kind: flow, flow: inner}
  - {id: second, kind: flow, flow: inner, input: {again: $input}}
edges:
  - {from: first, to: second}
"""


def test_two_nodes_running_the_same_flow_keep_their_baselines_under_their_own_ids(
    tmp_path: Path, store_url: str
) -> None:
    with ScriptedProvider(_echo) as provider:
        project = _project(tmp_path, provider.base_url)
    (project / ".salvor" / "flows" / "main.yaml").write_text(TWICE)
    baselines = project / ".salvor" / "flows" / "__baselines__"
    updated = _run(project, store_url, '"hello"', "--update-baselines")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert json.loads((baselines / "first" / "given.json").read_text()) == "hello"
    assert json.loads((baselines / "second" / "given.json").read_text()) == {"again": "hello"}
    # Comparing, each run reads its own baseline: both were sent.
    compared = _run(project, store_url, '"hello"')
    assert compared.returncode == 0, compared.stdout + compared.stderr
    (baselines / "second" / "given.json").write_text('{"again": "bye"}\n')
    changed = _run(project, store_url, '"hello"')
    assert changed.returncode == 3
    assert "snapshot 'given' differs from its baseline" in changed.stdout
    assert f"{os.path.realpath(baselines)}/second/given.json" in changed.stdout
