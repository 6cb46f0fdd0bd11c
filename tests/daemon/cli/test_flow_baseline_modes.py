"""Which runs of one call update their baselines, and what a later snapshot of the call reads:
``salvor graph run FILE --remote URL`` against a real `salvor serve` whose working directory is an
empty directory of its own (it never opens the project), the model the scripted provider.

* A ``flow`` node's ``update_baselines`` decides for its nested run (absent: as the run that
  starts it); the client sends bytes for what a comparing run reads and names the rest of an
  updating run's directory, also when the two share a directory, and writes only into the
  directories of runs that update.
* Within one call, a snapshot that compares reads the baseline an earlier snapshot of the call
  captured, in the same run or another nested run, and a capture says whether the client then
  writes its file or updates one it has.
* With ``--json``, every ``SALVOR_FLOW_FILES_LOG=1`` line is a JSON warning object on stderr.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from salvor.daemon.cli._baselines import write_baselines
from salvor.daemon.cli._flow_collect import collect_flow
from salvor.daemon.graphs._nested import flow_child_id
from salvor.protocol import EventKind

from tests.chaos.test_kill_serve import Daemon
from tests.daemon.cli.test_flow_remote import _agent, _echo
from tests.support.api import read_log_independently
from tests.support.cli import salvor_in_process
from tests.support.daemon_apart import daemon_apart
from tests.support.scripted_provider import ScriptedProvider

INNER = """\
schema_version: 1
nodes:
  - {id: given, kind: snapshot, name: given, of: $input}
edges: []
"""

# The call compares; its `fresh` run updates and its `held` run compares, whatever the call does.
PER_NODE = """\
schema_version: 1
nodes:
  - {id: answer, kind: agent, agent_file: ../../agents/echo.toml}
  - {id: check, kind: snapshot, name: reply, of: $nodes.answer}
  - {id: fresh, kind: flow, flow: inner, input: $nodes.answer, update_baselines: true}
  - {id: held, kind: flow, flow: inner, input: $nodes.answer, update_baselines: false}
edges:
  - {from: answer, to: check}
  - {from: check, to: fresh}
  - {from: fresh, to: held}
"""


class Project:
    """The project on the client, and the commands run from it against the daemon."""

    def __init__(self, tmp_path: Path, daemon: Daemon, provider: ScriptedProvider) -> None:
        self.daemon, self.provider = daemon, provider
        self.root = tmp_path / "proj"
        self.flows = self.root / ".salvor" / "flows"
        self.flows.mkdir(parents=True)
        (self.root / "agents" / "prompts").mkdir(parents=True)
        (self.root / "agents" / "echo.toml").write_text(_agent(provider.base_url))
        (self.root / "agents" / "prompts" / "echo.txt").write_text("You echo.")
        (self.flows / "inner.yaml").write_text(INNER)
        self.main = self.flows / "main.yaml"
        # As the client names them: the real path of the flows' directory.
        self.baselines = Path(os.path.realpath(self.flows)) / "__baselines__"

    def recorded(self, run_id: str) -> dict:
        """Each node's output as the run's log records it (a capture's record: the nodes after
        it, and the run's output, read the value it held)."""
        log = trio.run(read_log_independently, self.daemon.store_url, run_id)
        return {e.event.node: e.event.output for e in log if e.event.KIND is EventKind.NODE_EXITED}

    def flow(self, name: str, text: str) -> None:
        (self.flows / f"{name}.yaml").write_text(text)

    def baseline(self, run: str, name: str, value=None, *, text: str | None = None) -> Path:
        path = self.baselines / run / f"{name}.json"
        if value is not None or text is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text if text is not None else json.dumps(value) + "\n")
        return path

    def run(self, run_input: str, *flags: str, env: dict | None = None):
        return salvor_in_process(
            "graph",
            "run",
            str(self.main),
            "--remote",
            self.daemon.base_url,
            "--input",
            run_input,
            *flags,
            env={"PATH": "/usr/bin:/bin", **(env or {})},
        )


@pytest.fixture
def project(tmp_path: Path, store_url: str):
    with ScriptedProvider(_echo) as provider:
        daemon = daemon_apart(tmp_path, store_url, provider)
        daemon.start()
        try:
            yield Project(tmp_path, daemon, provider)
        finally:
            daemon.kill()


def _read(path: Path):
    return json.loads(path.read_text())


def test_a_flow_node_updates_or_compares_its_nested_run_whatever_the_call_does(
    project: Project,
) -> None:
    project.flow("main", PER_NODE)
    reply = project.baseline("main", "reply", "<hello>")
    held = project.baseline("held", "given", "<hello>")
    fresh = project.baseline("fresh", "given")

    # The call compares: `fresh` captures its baseline all the same, and the client writes it.
    compared = project.run('"hello"')
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert _read(fresh) == "<hello>"
    assert _read(reply) == "<hello>" and _read(held) == "<hello>"
    assert list(project.daemon.cwd.iterdir()) == []

    # The call updates: `held` still compares (and fails on the change), so nothing is written.
    updated = project.run('"bye"', "--update-baselines")
    assert updated.returncode == 3, updated.stdout + updated.stderr
    assert "node 'given': snapshot 'given' differs from its baseline" in updated.stdout
    assert f'{held}: at $ the baseline has "<hello>", the run "<bye>"' in updated.stdout
    assert _read(reply) == "<hello>" and _read(fresh) == "<hello>"

    # The client writes only into the directory of a run that updates.
    files = collect_flow(str(project.main), update_baselines=True)
    assert files.updating == {str(reply.parent), str(fresh.parent)}
    refused = write_baselines(files, {str(held): b'"x"\n', str(fresh): b'"y"\n'})
    assert refused == [
        f"baseline not written: {held}: it is not directly in a baseline directory of this run"
    ]
    assert _read(held) == "<hello>" and _read(fresh) == "y"


def test_an_update_baselines_that_is_not_a_boolean_is_refused_before_anything_is_sent(
    project: Project,
) -> None:
    project.flow("main", PER_NODE.replace("update_baselines: true", "update_baselines: yes-ish"))
    refused = project.run('"hello"')
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "is not a valid graph document" in refused.stderr
    checked = salvor_in_process("graph", "validate", str(project.main))
    assert checked.returncode == 1
    assert "nodes[2] ('fresh').update_baselines must be true or false" in checked.stdout
    assert project.provider.calls == []


# The call's own baselines and its nested run `main`'s share `__baselines__/main`.
SHARED = """\
schema_version: 1
nodes:
  - {id: answer, kind: agent, agent_file: ../../agents/echo.toml}
  - {id: check, kind: snapshot, name: reply, of: $nodes.answer}
  - {id: main, kind: flow, flow: inner, input: $nodes.answer, update_baselines: UPDATE}
edges:
  - {from: answer, to: check}
  - {from: check, to: main}
"""


def test_a_comparing_and_an_updating_run_sharing_a_directory(project: Project) -> None:
    reply = project.baseline("main", "reply", "<hello>")
    given = project.baseline("main", "given", "<<old>>")
    other = project.baseline("main", "other", "kept")

    # The call compares, its nested run updates (walked first): reply's bytes, the rest named.
    project.flow("main", SHARED.replace("UPDATE", "true"))
    files = collect_flow(str(project.main))
    members = {key: m for key, m in files.bundle.members.items() if m.role == "baseline"}
    assert set(members) == {str(reply), str(given), str(other)}
    assert members[str(reply)].sha256 is not None
    assert members[str(given)].state == members[str(other)].state == "listed"
    assert files.updating == {str(reply.parent)}

    # The call updates, its nested run compares (walked first): given's bytes, the rest named.
    project.flow("main", SHARED.replace("UPDATE", "false"))
    files = collect_flow(str(project.main), update_baselines=True)
    members = {key: m for key, m in files.bundle.members.items() if m.role == "baseline"}
    assert members[str(given)].sha256 is not None
    assert members[str(reply)].state == members[str(other)].state == "listed"

    # Run: the call compares its reply, the nested run updates given, in the same directory.
    project.flow("main", SHARED.replace("UPDATE", "true"))
    ran = project.run('"hello"', "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout)
    assert result["output"]["main"]["given"] == "<hello>"  # what the nodes after it read
    captured = project.recorded(flow_child_id(result["run"], "main"))["given"]
    assert captured == {
        "baseline": "captured",
        "path": str(given),
        "value": "<hello>",
        "client": "updates",
    }
    assert _read(given) == "<hello>"
    assert _read(reply) == "<hello>" and _read(other) == "kept"


# A nested run captures `__baselines__/main/given.json`, which the call's own snapshot (also of
# stem `main`) and a run two levels down (`relay` runs `mid`, whose `main` runs `inner`) compare
# with, before the client has any such file.
CAPTURE_THEN_READ = """\
schema_version: 1
nodes:
  - {id: main, kind: flow, flow: inner, input: $input, update_baselines: true}
  - {id: check, kind: snapshot, name: given, of: $input}
  - {id: relay, kind: flow, flow: mid, input: $input}
edges:
  - {from: main, to: check}
  - {from: check, to: relay}
"""

MID = """\
schema_version: 1
nodes:
  - {id: main, kind: flow, flow: inner, input: $input}
edges: []
"""


def test_a_later_snapshot_of_the_call_reads_what_an_earlier_one_captured(
    project: Project,
) -> None:
    project.flow("main", CAPTURE_THEN_READ)
    project.flow("mid", MID)
    given = project.baseline("main", "given", text='"stale"\n')
    ran = project.run('"tide"', "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout)
    assert result["status"] == "completed"
    # The deepest run compared with the capture: its output is the value, not a capture.
    assert result["output"] == {"relay": {"main": {"given": "tide"}}}
    assert _read(given) == "tide"

    # The capture is the baseline of the call only: without it, the stale file is compared.
    project.flow(
        "main", CAPTURE_THEN_READ.replace("update_baselines: true", "update_baselines: false")
    )
    given.write_text('"stale"\n')
    stale = project.run('"tide"')
    assert stale.returncode == 3
    assert 'the baseline has "stale", the run "tide"' in stale.stdout


# Three snapshots walked one after another (none waits on another: all are the run's output).
TWICE = """\
schema_version: 1
nodes:
  - {id: first, kind: snapshot, name: twice, of: $input.a}
  - {id: second, kind: snapshot, name: twice, of: $input.b}
  - {id: third, kind: snapshot, name: kept, of: $input.a}
edges: []
"""


def test_a_capture_says_whether_the_client_writes_its_file_or_updates_one(
    project: Project,
) -> None:
    project.flow("main", TWICE)
    kept = project.baseline("main", "kept", "before")
    twice = project.baseline("main", "twice")
    ran = project.run('{"a": "x", "b": "y"}', "--update-baselines", "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    outputs = project.recorded(json.loads(ran.stdout)["run"])
    assert outputs["first"]["client"] == "writes"  # nothing there yet
    assert outputs["second"]["client"] == "updates"  # the first captured the same path
    assert outputs["third"]["client"] == "updates"  # the client has the file
    # The last capture of a path is what the client writes.
    assert _read(twice) == "y" and _read(kept) == "x"


def test_json_prints_each_flow_files_line_as_a_warning_object(
    project: Project, store_url: str
) -> None:
    project.flow("main", PER_NODE)
    project.baseline("held", "given", "<hello>")
    log = {"SALVOR_FLOW_FILES_LOG": "1"}
    remote = project.run('"hello"', "--update-baselines", "--json", env=log)
    assert remote.returncode == 0, remote.stdout + remote.stderr
    lines = [json.loads(line) for line in remote.stderr.splitlines()]
    assert all(set(line) == {"warning"} for line in lines), lines
    said = [line["warning"] for line in lines]
    assert f"[flow-files] agent {project.root.resolve()}/agents/echo.toml: inline" in said[0]
    held = project.baseline("held", "given")
    assert f"[flow-files] baseline {held}: inline 10" in said
    written = [s for s in said if s.endswith(": written")]
    assert written == [
        f"[flow-files] baseline {project.baseline(run, name)}: written"
        for run, name in (("fresh", "given"), ("main", "reply"))
    ]
    # Locally too, and without --json the lines are as they were.
    local_env = {**log, "SALVOR_STORE": store_url}
    plain = salvor_in_process(
        "graph",
        "run",
        str(project.main),
        "--input",
        '"hello"',
        "--json",
        env={"PATH": "/usr/bin:/bin", **local_env},
    )
    assert plain.returncode == 0, plain.stdout + plain.stderr
    warnings = [json.loads(line)["warning"] for line in plain.stderr.splitlines()]
    assert any(w.startswith("[flow-files] baseline ") and w.endswith(": written") for w in warnings)
    text = salvor_in_process(
        "graph",
        "run",
        str(project.main),
        "--input",
        '"hello"',
        env={"PATH": "/usr/bin:/bin", **local_env},
    )
    assert text.returncode == 0, text.stdout + text.stderr
    assert text.stderr.splitlines()[0].startswith("[flow-files] agent ")


def test_a_baseline_linking_to_nothing_is_missing_to_a_compare_and_refused_to_an_update(
    project: Project,
) -> None:
    reply = project.baseline("main", "reply", "<hello>")
    reply.unlink()
    reply.symlink_to(reply.parent / "gone.json")
    project.flow("main", SHARED.replace("UPDATE", "false"))

    compared = collect_flow(str(project.main))
    assert compared.bundle.members[str(reply)].state == "missing"

    updated = collect_flow(str(project.main), update_baselines=True)
    member = updated.bundle.members[str(reply)]
    assert (member.state, member.error) == ("refused", f"{reply} links to nothing")
