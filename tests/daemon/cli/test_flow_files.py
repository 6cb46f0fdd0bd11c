"""Flow files: a graph document in a project naming its agents by file, collected on this machine
by the client policy and run from the collected files only.

Real files in a temporary project, the offline demo model, the `salvor` command in this process;
the pre-check and the collector are also called directly for the cases a command line cannot
reach on this disk (a flow sent over a link, a member the client never sent).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from salvor.daemon.agents import parse_definition
from salvor.daemon.cli._flow_collect import collect_flow
from salvor.daemon.graphs import FlowFiles, check_flow
from salvor.protocol import EventKind, member_key
from salvor.store import EventStore

from tests.support.cli import salvor_in_process

AGENT = """\
name = "researcher"
model = "demo-planner"
system_prompt_path = "prompt.txt"
max_response_tokens = 1024
[llm]
provider = "demo"
[budgets]
steps = 4
[output_schema]
type = "object"
required = ["topic", "notes"]
[output_schema.properties.topic]
type = "string"
[output_schema.properties.notes]
type = "string"
"""

FLOW = """\
schema_version: 1
nodes:
  - id: research
    kind: agent
    agent_file: {target}
    input: {{topic: $input.topic}}
  - id: approve
    kind: gate
    prompt: Keep these notes?
edges:
  - {{from: research, to: approve}}
"""


def _env(store_url: str, **extra: str) -> dict[str, str]:
    return {"SALVOR_STORE": store_url, "PATH": "/usr/bin:/bin", **extra}


def _project(tmp_path: Path, target: str = "../../agents/research/researcher.toml") -> Path:
    """A project whose flow names an agent file two directories away, its prompt beside it."""
    project = tmp_path / "proj"
    (project / ".salvor" / "flows").mkdir(parents=True)
    agents = project / "agents" / "research"
    agents.mkdir(parents=True)
    (agents / "researcher.toml").write_text(AGENT)
    (agents / "prompt.txt").write_text("Research the topic you are given; return your notes.")
    (project / ".salvor" / "flows" / "notes.yaml").write_text(FLOW.format(target=target))
    return project


def _flow(project: Path, name: str = "notes") -> Path:
    return project / ".salvor" / "flows" / f"{name}.yaml"


def _parse(text: str, fmt: str, read_prompt) -> object:
    return parse_definition(text, fmt, read_prompt=read_prompt)


def _errors(path: Path | str, **bundle: object) -> list[dict]:
    files = collect_flow(str(path))
    files = FlowFiles(replace(files.bundle, **bundle), files.contents)
    return [error.to_json() for error in check_flow(files, _parse).errors]


def _validate(path: Path | str, store_url: str) -> tuple[int, dict]:
    done = salvor_in_process("graph", "validate", str(path), "--json", env=_env(store_url))
    return done.returncode, json.loads(done.stdout)


def test_a_flow_runs_its_agent_file_and_prompt_from_the_files_kept_with_the_run(
    tmp_path: Path, store_url: str
) -> None:
    project = _project(tmp_path)
    started = salvor_in_process(
        "graph",
        "run",
        str(_flow(project)),
        "--input",
        '{"topic": "bees"}',
        env=_env(store_url, SALVOR_FLOW_FILES_LOG="1"),
    )
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.splitlines()[0]
    assert "suspended, waiting on a person: Keep these notes?" in started.stdout
    real = os.path.realpath(project)
    assert started.stderr.splitlines() == [
        f"[flow-files] agent {real}/agents/research/researcher.toml: inline {len(AGENT)}",
        f"[flow-files] prompt {real}/agents/research/prompt.txt: inline 52",
    ]
    # The walk never opens a client path: with the project gone the run resumes and completes.
    shutil.rmtree(project)
    resumed = salvor_in_process("resume", run_id, "--input", '{"ok": 1}', env=_env(store_url))
    assert resumed.returncode == 0, resumed.stderr
    assert f'run {run_id} completed: {{"approve": {{"ok": 1}}}}' in resumed.stdout
    # A fork re-walks from the agent file's node with the files kept with its origin.
    forked = salvor_in_process("fork", run_id, "--from-node", "research", env=_env(store_url))
    assert forked.returncode == 0 and "suspended" in forked.stdout, forked.stderr
    with EventStore.open(store_url) as store:
        head = store.read_log(run_id)[0]
        assert head.kind == EventKind.GRAPH_RUN_STARTED
        manifest = json.loads(store.flow_files.get(head.event.flow))
        (agent,) = [m for m in manifest["members"] if m["role"] == "agent"]
        assert agent["key"] == member_key(f"{real}/.salvor/flows", agent["key"].split("\0")[1])
        assert store.flow_files.get(agent["sha256"]) == AGENT.encode()
        # The agent is stored with its prompt inlined, under the hash a local load gives it.
        (stored,) = store.definitions.list_agents()
        assert "Research the topic you are given" in stored.definition


def test_a_symlinked_flow_names_its_files_beside_its_real_file(
    tmp_path: Path, store_url: str
) -> None:
    project = _project(tmp_path)
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    (elsewhere / "linked.yaml").symlink_to(_flow(project))
    code, answer = _validate(elsewhere / "linked.yaml", store_url)
    assert code == 0 and answer["valid"] is True, answer
    done = salvor_in_process(
        "graph", "run", str(elsewhere / "linked.yaml"), "--input", '{"topic": "ants"}',
        env=_env(store_url),
    )  # fmt: skip
    assert done.returncode == 0 and "suspended" in done.stdout, done.stderr


def test_a_missing_agent_file_fails_the_check_before_anything_is_stored(
    tmp_path: Path, store_url: str
) -> None:
    project = _project(tmp_path, target="../../agents/research/nobody.toml")
    code, answer = _validate(_flow(project), store_url)
    assert code == 1
    (error,) = answer["errors"]
    assert error["code"] == "missing_member" and error["node"] == "research"
    assert error["target"] == "../../agents/research/nobody.toml"
    done = salvor_in_process("graph", "run", str(_flow(project)), env=_env(store_url))
    assert done.returncode == 1 and "does not pass the flow check (1 error(s)" in done.stderr
    with EventStore.open(store_url) as store:
        assert store.list_runs(limit=10)[0] == [] and store.definitions.list_agents() == []


@pytest.mark.parametrize("case", ["outside", "wrong_kind", "directory", "too_big", "loop"])
def test_the_client_policy_refuses_each_file_it_will_not_send_with_its_reason(
    tmp_path: Path, case: str
) -> None:
    project = _project(tmp_path, target=f"../../agents/{case}.toml")
    agents = project / "agents"
    target = agents / f"{case}.toml"
    if case == "outside":
        (tmp_path / "outside.toml").write_text(AGENT)
        target.symlink_to(tmp_path / "outside.toml")
        reason = f"../../agents/{case}.toml is outside every root this client serves ("
    elif case == "wrong_kind":
        (agents / "notes.txt").write_text(AGENT)
        target.symlink_to(agents / "notes.txt")
        reason = f"../../agents/{case}.toml links to a file that is not a TOML file"
    elif case == "directory":
        target.mkdir()
        reason = "EISDIR: illegal operation on a directory, read"
    elif case == "too_big":
        with open(target, "wb") as handle:
            handle.truncate(32 * 1024 * 1024 + 1)
        reason = f"{target} is larger than the 32 MiB cap on a file sent to the daemon"
    else:
        target.symlink_to(agents / "loop.toml")
        reason = "ELOOP: "
    member = next(iter(collect_flow(str(_flow(project))).bundle.members.values()))
    assert member.state == "refused" and member.error.startswith(reason), member
    (error,) = _errors(_flow(project))
    assert error["code"] == "refused_member" and error["node"] == "research"
    assert reason in error["message"]


def test_a_missing_file_outside_every_root_is_refused_not_missing(tmp_path: Path) -> None:
    project = _project(tmp_path, target="../../../nowhere/agent.toml")
    member = next(iter(collect_flow(str(_flow(project))).bundle.members.values()))
    assert member.state == "refused" and "outside every root" in member.error


def test_a_name_spelt_in_another_case_is_reported_with_the_listed_name(tmp_path: Path) -> None:
    project = _project(tmp_path, target="../../agents/research/Researcher.toml")
    member = next(iter(collect_flow(str(_flow(project))).bundle.members.values()))
    assert member.spelling == {
        "state": "case_folded",
        "actual": "researcher.toml",
        "addressable": False,
    }
    (error,) = _errors(_flow(project))
    assert error["code"] == "member_spelling" and error["actual"] == "researcher.toml"


def _chain(project: Path, names: list[str], last: str | None) -> None:
    """Flows ``names[0] -> names[1] -> ...``, the last naming ``last`` (or nothing)."""
    for name, nested in zip(names, [*names[1:], last], strict=True):
        node = (
            f"  - {{id: step, kind: flow, flow: {nested}}}\n"
            if nested
            else ("  - {id: wait, kind: delay, seconds: 1}\n")
        )
        _flow(project, name).write_text(f"schema_version: 1\nnodes:\n{node}edges: []\n")


def test_nested_flows_deeper_than_twenty_levels_are_refused_naming_the_node(
    tmp_path: Path, store_url: str
) -> None:
    project = _project(tmp_path)
    names = [f"level{index}" for index in range(22)]
    _chain(project, names, None)
    code, answer = _validate(_flow(project, "level0"), store_url)
    assert code == 1
    (error,) = answer["errors"]
    assert error["code"] == "flow_too_deep" and error["node"] == "step"
    assert error["file"].endswith("/level20.yaml")
    _chain(project, names[:21], None)  # twenty nested flows below the first: at the limit
    code, answer = _validate(_flow(project, "level0"), store_url)
    assert code == 0, answer


def test_a_flow_naming_a_flow_above_it_is_a_cycle(tmp_path: Path, store_url: str) -> None:
    project = _project(tmp_path)
    _chain(project, ["first", "second"], "first")
    code, answer = _validate(_flow(project, "first"), store_url)
    assert code == 1
    (error,) = answer["errors"]
    assert error["code"] == "flow_cycle" and error["node"] == "step"
    assert [Path(path).name for path in error["chain"]] == [
        "first.yaml",
        "second.yaml",
        "first.yaml",
    ]


def test_a_flow_outside_a_project_cannot_name_flows(tmp_path: Path, store_url: str) -> None:
    (tmp_path / "loose.yaml").write_text(
        "schema_version: 1\nnodes:\n  - {id: step, kind: flow, flow: other}\nedges: []\n"
    )
    code, answer = _validate(tmp_path / "loose.yaml", store_url)
    assert code == 1 and answer["errors"][0]["code"] == "flow_without_project"


def test_over_a_link_a_process_agent_is_refused_and_an_unsent_member_is_unknown(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path)
    target = project / "agents" / "research" / "researcher.toml"
    target.write_text('kind = "process"\ncommand = ["true"]\n')
    assert _errors(_flow(project)) == []
    (error,) = _errors(_flow(project), linked=True)
    assert error["code"] == "process_agent_over_link" and error["node"] == "research"
    target.write_text(AGENT)
    (error,) = _errors(_flow(project), members={})
    assert error["code"] == "unknown_member" and error["node"] == "research"


def test_a_map_body_may_name_its_agent_by_file(tmp_path: Path, store_url: str) -> None:
    project = _project(tmp_path)
    _flow(project, "each").write_text(
        "schema_version: 1\nnodes:\n  - id: each\n    kind: map\n    over: $input\n"
        "    body: {kind: agent, agent_file: ../../agents/research/researcher.toml, "
        "input: {topic: $item}}\nedges: []\n"
    )
    done = salvor_in_process(
        "graph", "run", str(_flow(project, "each")), "--input", '["bees", "ants"]',
        env=_env(store_url),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"topic": "bees"' in done.stdout and '"topic": "ants"' in done.stdout
