"""A pinned agent node: a flow's regression test. A run that updates its baselines records the
node's calls in ``<node>.calls.json``; a run that compares answers every call from it, with no
provider call and no tool performed, and fails at the first call that is not the baseline's.

The agent is aimed at the scripted provider (a real HTTP server, counting what it serves); the
command runs in this process over a real store and a real project in a temporary directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from salvor.protocol import EventKind
from salvor.store import EventStore

from tests.support.cli import salvor_in_process
from tests.support.flows import tool_use
from tests.support.scripted_provider import ProviderCall, ScriptedProvider

FLOW = """\
schema_version: 1
nodes:
  - {id: answer, kind: agent, agent_file: ../../agents/echo.toml, pinned: true}
edges: []
"""


def agent_file(base_url: str, tools: tuple[str, ...] = ()) -> str:
    """A built-in agent on the scripted provider, its prompt in ``prompt.md`` beside it."""
    tables = "".join(f'\n[[tools]]\nname = "{tool}"\n' for tool in tools)
    return (
        'name = "echo"\nmodel = "scripted"\nmax_response_tokens = 256\n'
        'system_prompt_path = "prompt.md"\n'
        f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\nmax_retries = 0\n'
        f"timeout_seconds = 30\n{tables}"
    )


def echo(call: ProviderCall):
    """Answers the task's text back; with a refund tool offered, refunds once first."""
    messages = call.request["messages"]
    offered = [tool["name"] for tool in call.request.get("tools") or []]
    if "issue_refund" in offered and len(messages) == 1:
        return tool_use("issue_refund", {"invoice_id": "inv_7", "amount_cents": 500})
    text = messages[0]["content"][0]["text"]
    answer = {"model": call.request["model"], "content": [{"type": "text", "text": text}]}
    return {**answer, "stop_reason": "end_turn"}, {"input_tokens": 3, "output_tokens": 2}


def project_with(tmp_path: Path, base_url: str, tools: tuple[str, ...] = ()) -> Path:
    project = tmp_path / "proj"
    flows = project / ".salvor" / "flows"
    flows.mkdir(parents=True)
    (project / "agents").mkdir()
    (project / "agents" / "echo.toml").write_text(agent_file(base_url, tools))
    (project / "agents" / "prompt.md").write_text("You echo the task.\n")
    (flows / "main.yaml").write_text(FLOW)
    return project


def baseline_of(project: Path) -> Path:
    return project / ".salvor" / "flows" / "__baselines__" / "main" / "answer.calls.json"


def _run(project: Path, store_url: str, *flags: str, effects: Path | None = None):
    env = {"SALVOR_STORE": store_url, "PATH": "/usr/bin:/bin"}
    if effects is not None:
        env["SALVOR_DEMO_EFFECTS"] = str(effects)
    return salvor_in_process(
        "graph",
        "run",
        str(project / ".salvor" / "flows" / "main.yaml"),
        "--input",
        '"hello"',
        *flags,
        env=env,
    )


def test_update_records_the_calls_and_compare_answers_them_with_no_provider_call(
    tmp_path: Path, store_url: str
) -> None:
    with ScriptedProvider(echo) as provider:
        project = project_with(tmp_path, provider.base_url)
        missing = _run(project, store_url)
        assert missing.returncode == 3
        assert (
            f"pinned agent 'answer' has no baseline at {os.path.realpath(baseline_of(project))}"
            in (missing.stdout)
        )
        assert len(provider.calls) == 0

        updated = _run(project, store_url, "--update-baselines")
        assert updated.returncode == 0, updated.stdout + updated.stderr
        assert len(provider.calls) == 1
        recorded = json.loads(baseline_of(project).read_text())
        assert recorded["node"] == "answer"
        [call] = recorded["calls"]
        assert call["kind"] == "model"
        assert call["request"]["system"] == "You echo the task.\n"
        assert call["response"]["content"][0]["text"] == "hello"

        compared = _run(project, store_url)
        assert compared.returncode == 0, compared.stdout + compared.stderr
        assert len(provider.calls) == 1, "the compare asked the provider"
        assert '"hello"' in compared.stdout

        (project / "agents" / "prompt.md").write_text("You echo the task, loudly.\n")
        changed = _run(project, store_url)
        assert len(provider.calls) == 1
    assert changed.returncode == 3, changed.stdout + changed.stderr
    assert (
        f"node 'answer': call 1 differs from its baseline {os.path.realpath(baseline_of(project))}"
        ": the model request at $.system the baseline has "
        '"You echo the task.\\n", the run "You echo the task, loudly.\\n"'
    ) in changed.stdout


def test_a_baseline_with_more_calls_fails_naming_the_call_never_made(
    tmp_path: Path, store_url: str
) -> None:
    with ScriptedProvider(echo) as provider:
        project = project_with(tmp_path, provider.base_url)
        assert _run(project, store_url, "--update-baselines").returncode == 0
        recorded = json.loads(baseline_of(project).read_text())
        recorded["calls"].append({**recorded["calls"][0]})
        baseline_of(project).write_text(json.dumps(recorded))
        compared = _run(project, store_url)
        assert len(provider.calls) == 1
    assert compared.returncode == 3
    assert "node 'answer': the agent ended after 1 of the 2 calls its baseline" in compared.stdout
    assert "call 2 (a call of model 'scripted') was never made" in compared.stdout


def events_of(store_url: str, kind: EventKind) -> list:
    """Every event of ``kind`` in every run of the store, in each run's order."""
    store = EventStore.open(store_url)
    try:
        return [
            envelope.event
            for run in store.list_runs(limit=100)[0]
            for envelope in store.read_log(run.run_id)
            if envelope.kind is kind
        ]
    finally:
        store.close()


def _runs(store_url: str) -> list[str]:
    store = EventStore.open(store_url)
    try:
        return [run.run_id for run in store.list_runs(limit=100)[0]]
    finally:
        store.close()


def test_a_tool_call_inside_a_pinned_agent_is_answered_from_the_baseline_never_performed(
    tmp_path: Path, store_url: str
) -> None:
    ledger, compare_ledger = tmp_path / "effects.jsonl", tmp_path / "compare-effects.jsonl"
    with ScriptedProvider(echo) as provider:
        project = project_with(tmp_path, provider.base_url, tools=("issue_refund",))
        updated = _run(project, store_url, "--update-baselines", effects=ledger)
        assert updated.returncode == 0, updated.stdout + updated.stderr
        assert len(provider.calls) == 2
        assert [json.loads(line)["tool"] for line in ledger.read_text().splitlines()] == [
            "issue_refund:sent",
            "issue_refund",
        ]
        calls = json.loads(baseline_of(project).read_text())["calls"]
        assert [(call["kind"], call.get("tool")) for call in calls] == [
            ("model", None),
            ("tool", "issue_refund"),
            ("model", None),
        ]
        # Another store: no claim of the update run's refund to copy, so only the baseline can
        # answer the refund without performing it.
        other_store = f"sqlite:///{tmp_path / 'compare.db'}"
        compared = _run(project, other_store, effects=compare_ledger)
        assert compared.returncode == 0, compared.stdout + compared.stderr
        assert len(provider.calls) == 2
        # A fork of the comparing run walks the same files: its refund is answered from the
        # baseline again, so it is no write that could fire twice, and nothing reaches the world.
        [compare_run] = _runs(other_store)
        forked = salvor_in_process(
            "fork",
            compare_run,
            "--from-node",
            "answer",
            env={
                "SALVOR_STORE": other_store,
                "SALVOR_DEMO_EFFECTS": str(compare_ledger),
                "PATH": "/usr/bin:/bin",
            },
        )
        assert forked.returncode == 0, forked.stdout + forked.stderr
        assert len(provider.calls) == 2
    shown = salvor_in_process("log", compare_run, env={"SALVOR_STORE": other_store})
    tagged = [line.split()[2] for line in shown.stdout.splitlines() if line.endswith("[Baseline]")]
    assert tagged == ["ModelCallCompleted", "ToolCallCompleted", "ModelCallCompleted"]
    assert not compare_ledger.exists() or compare_ledger.read_text() == ""
    assert len(_runs(other_store)) == 2
    completions = events_of(other_store, EventKind.TOOL_CALL_COMPLETED)
    assert [event.baseline for event in completions] == 2 * [
        str(os.path.realpath(baseline_of(project)))
    ]
    models = events_of(other_store, EventKind.MODEL_CALL_COMPLETED)
    assert len(models) == 4 and all(event.baseline is not None for event in models)


OUTER = """\
schema_version: 1
nodes:
  - {id: nested, kind: flow, flow: inner}
edges: []
"""


def test_a_nested_flows_pinned_node_keeps_its_calls_under_the_node_that_runs_it(
    tmp_path: Path, store_url: str
) -> None:
    with ScriptedProvider(echo) as provider:
        project = project_with(tmp_path, provider.base_url)
        flows = project / ".salvor" / "flows"
        (flows / "inner.yaml").write_text(FLOW)
        (flows / "main.yaml").write_text(OUTER)
        updated = _run(project, store_url, "--update-baselines")
        assert updated.returncode == 0, updated.stdout + updated.stderr
        assert len(provider.calls) == 1
        calls = json.loads((flows / "__baselines__" / "nested" / "answer.calls.json").read_text())
        assert [call["kind"] for call in calls["calls"]] == ["model"]
        assert not (flows / "__baselines__" / "main").exists()
        compared = _run(project, store_url)
        assert compared.returncode == 0, compared.stdout + compared.stderr
        assert len(provider.calls) == 1


def test_a_baseline_that_is_not_a_list_of_calls_is_refused_before_the_first_node(
    tmp_path: Path, store_url: str
) -> None:
    with ScriptedProvider(echo) as provider:
        project = project_with(tmp_path, provider.base_url)
        baseline_of(project).parent.mkdir(parents=True)
        baseline_of(project).write_text('{"node": "answer", "calls": [{"kind": "model"}]}')
        refused = _run(project, store_url)
        assert len(provider.calls) == 0
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (
        f"node 'answer': the baseline {os.path.realpath(baseline_of(project))} is not its calls: "
        "calls[0] is a model call without an object response and usage"
    ) in refused.stderr
    assert refused.stdout == ""
