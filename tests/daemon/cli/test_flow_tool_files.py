"""Tool files: a flow's tool node hands its tool a file of the client's.

A real `salvor serve` in a directory of its own with the demo tools (``read_document`` declares
its ``path`` a file input), ``salvor graph run FILE --remote URL`` and ``POST /v1/graph-runs``
over real HTTP, real files in a temporary project, and the demo tools' ledger, which records the
path the tool actually opened.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from salvor.daemon.cli._flow_collect import collect_flow
from salvor.daemon.tools import Tool, check_file_inputs
from salvor.protocol import Effect, EventKind, call_body
from salvor.store import EventStore

from tests.chaos.test_kill_serve import Daemon
from tests.support.cli import salvor_in_process
from tests.support.daemon_apart import daemon_apart
from tests.support.runtime import ledger

SETTLE_SECONDS = 60.0
DOCUMENT = {"title": "tide tables", "rows": [1, 2, 3]}


def _flow(*nodes: str) -> str:
    return (
        "schema_version: 1\nnodes:\n" + "".join(f"  - {node}\n" for node in nodes) + "edges: []\n"
    )


def _read(node: str, path: str) -> str:
    return f"{{id: {node}, kind: tool, tool: read_document, input: {{path: {json.dumps(path)}}}}}"


class Project:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "proj"
        self.flows = self.root / ".salvor" / "flows"
        self.flows.mkdir(parents=True)
        (self.root / "data").mkdir()
        self.document = self.root / "data" / "doc.json"
        self.document.write_text(json.dumps(DOCUMENT))

    def flow(self, text: str, name: str = "main") -> Path:
        path = self.flows / f"{name}.yaml"
        path.write_text(text)
        return path


class Remote:
    def __init__(self, tmp_path: Path, daemon: Daemon, store_url: str) -> None:
        self.tmp_path = tmp_path
        self.daemon = daemon
        self.store_url = store_url
        self.effects = tmp_path / "effects.jsonl"
        self.project = Project(tmp_path)

    def run(self, flow: Path, **env: str):
        return salvor_in_process(
            "graph",
            "run",
            str(flow),
            "--remote",
            self.daemon.base_url,
            "--json",
            env={"PATH": "/usr/bin:/bin", **env},
        )

    def post(self, flow: Path, *, members: bool = True):
        files = collect_flow(str(flow), file_inputs={"read_document": ["path"]})
        body = call_body(files.bundle, dict(files.contents))
        if not members:
            del body["members"]
        with self.daemon.client(timeout=SETTLE_SECONDS) as client:
            return client.post("/v1/graph-runs", json=body)


@pytest.fixture
def remote(tmp_path: Path, store_url: str):
    """A real daemon (demo tools) whose working directory is an empty directory of its own."""
    daemon = daemon_apart(tmp_path, store_url)
    daemon.start()
    try:
        yield Remote(tmp_path, daemon, store_url)
    finally:
        daemon.kill()


def test_get_tools_lists_each_tool_with_its_declared_file_inputs(remote: Remote) -> None:
    with remote.daemon.client(timeout=SETTLE_SECONDS) as client:
        response = client.get("/v1/tools")
    assert response.status_code == 200, response.text
    tools = {tool["name"]: tool for tool in response.json()["tools"]}
    assert tools["read_document"] == {
        "name": "read_document",
        "effect": "read",
        "file_inputs": [{"target": "path", "path": "${path}"}],
    }
    assert tools["issue_refund"] == {"name": "issue_refund", "effect": "write", "file_inputs": []}
    assert list(tools) == sorted(tools)


def test_a_remote_flow_hands_its_tool_a_temporary_copy_of_the_clients_file(
    remote: Remote,
) -> None:
    path = str(remote.project.document)
    flow = remote.project.flow(_flow(_read("doc", path), _read("again", path)))
    done = remote.run(flow, SALVOR_FLOW_FILES_LOG="1")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed", result
    assert result["output"]["doc"]["json"] == DOCUMENT
    assert result["output"]["again"]["json"] == DOCUMENT
    # Sent once, as a tool member keyed by the path as written; never its content in the log.
    size = remote.project.document.stat().st_size
    assert done.stderr.count(f"[flow-files] tool {path}: inline {size}") == 1, done.stderr
    assert "tide tables" not in done.stderr
    # The tool opened a copy of the daemon's, gone once it returned; the log holds the client's.
    opened = [entry["opened"] for entry in ledger(remote.effects)]
    assert len(opened) == 2 and path not in opened
    assert all(not os.path.exists(copy) and copy.endswith("doc.json") for copy in opened)
    with EventStore.open(remote.store_url) as store:
        log = store.read_log(result["run"])
    inputs = [e.event.input for e in log if e.kind == EventKind.TOOL_CALL_REQUESTED]
    assert inputs == [{"path": path}, {"path": path}]
    assert list(remote.daemon.cwd.iterdir()) == []

    # A fork re-walks the second read from the files kept with the run: the client's is gone.
    remote.project.document.unlink()
    with remote.daemon.client(timeout=SETTLE_SECONDS) as client:
        forked = client.post(f"/v1/runs/{result['run']}/fork", json={"from_node": "again"})
        assert forked.status_code == 201, forked.text
        fork = forked.json()["run"]
        deadline = time.monotonic() + SETTLE_SECONDS
        while (status := client.get(f"/v1/runs/{fork}").json()["status"])["state"] not in (
            "completed",
            "failed",
        ):
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
    assert status["state"] == "completed", status
    assert status["output"]["again"]["json"] == DOCUMENT
    assert len(ledger(remote.effects)) == 3


def test_a_file_the_client_has_not_fails_the_step_naming_path_argument_and_tool(
    remote: Remote,
) -> None:
    missing = str(remote.project.root / "data" / "gone.json")
    flow = remote.project.flow(_flow(_read("doc", missing)))
    done = remote.run(flow)
    assert done.returncode == 3, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "failed"
    assert result["error"] == (
        f"node 'doc': the client has no file at \"{missing}\" (argument path of read_document)"
    )
    assert ledger(remote.effects) == []


def test_the_pre_check_refuses_what_is_no_file_argument_and_what_the_client_refused(
    remote: Remote, tmp_path: Path
) -> None:
    project = remote.project
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (project.root / "data" / "sheet.csv").write_text("a,b\n")
    (project.root / "data" / "linked.json").symlink_to(project.root / "data" / "sheet.csv")
    (project.root / "data" / "folder.json").mkdir()
    data = project.root / "data"
    with open(data / "big.png", "wb") as big:  # sparse: its size is what the client checks
        big.truncate(32 * 1024 * 1024 + 1)
    flow = project.flow(
        _flow(
            "{id: ref, kind: tool, tool: read_document, input: {path: $input.path}}",
            _read("relative", "data/doc.json"),
            _read("csv", str(data / "sheet.csv")),
            _read("outside", str(outside)),
            _read("linked", str(data / "linked.json")),
            _read("folder", str(data / "folder.json")),
            _read("big", str(data / "big.png")),
        )
    )
    response = remote.post(flow)
    assert response.status_code == 400, response.text
    errors = {e["node"]: e for e in response.json()["error"]["details"]["errors"]}
    assert {errors[n]["code"] for n in ("ref", "relative", "csv")} == {"tool_file_argument"}
    assert "'$input.path' is not one" in errors["ref"]["message"]
    assert "'data/doc.json' is not one" in errors["relative"]["message"]
    assert errors["csv"]["argument"] == "path" and errors["csv"]["tool"] == "read_document"
    refused = ("outside", "linked", "folder", "big")
    assert {errors[n]["code"] for n in refused} == {"refused_member"}
    assert "is larger than the 32 MiB cap" in errors["big"]["message"]
    assert "is outside every root this client serves" in errors["outside"]["message"]
    assert (
        f"{data / 'linked.json'} links to a file that is not one of .json, .png, .txt, .yaml"
        in errors["linked"]["message"]
    )
    assert "EISDIR" in errors["folder"]["message"]
    with remote.daemon.client(timeout=SETTLE_SECONDS) as client:
        assert client.get("/v1/runs").json()["runs"] == []
    # From the command line: one sentence naming the nodes, exit 1, nothing run.
    done = remote.run(flow)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "'relative'" in done.stderr and "'folder'" in done.stderr
    assert ledger(remote.effects) == []


def test_a_daemon_facing_tool_files_without_members_says_to_update_the_client(
    remote: Remote,
) -> None:
    flow = remote.project.flow(_flow(_read("doc", str(remote.project.document))))
    response = remote.post(flow, members=False)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "node 'doc' hands the tool read_document a file of the client's (argument path)" in (
        message
    )
    assert "update the salvor client" in message


def test_a_local_flow_run_hands_its_tool_the_same_copy(tmp_path: Path) -> None:
    project = Project(tmp_path)
    effects = tmp_path / "effects.jsonl"
    path = str(project.document)
    flow = project.flow(_flow(_read("doc", path)))
    env = {
        "SALVOR_STORE": f"sqlite:///{tmp_path / 'local.db'}",
        "SALVOR_DEMO_EFFECTS": str(effects),
        "PATH": "/usr/bin:/bin",
    }
    done = salvor_in_process("graph", "run", str(flow), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"tide tables"' in done.stdout.splitlines()[-1]
    (opened,) = [entry["opened"] for entry in ledger(effects)]
    assert opened != path and not os.path.exists(opened)

    # A path that is no file argument reaches the tool as it is, and the demo tool reads only
    # the daemon's copies: a caller's path never makes it read a file of the daemon's.
    chosen = project.flow(
        _flow("{id: doc, kind: tool, tool: read_document, input: {path: $input}}"), name="chosen"
    )
    refused = salvor_in_process("graph", "run", str(chosen), "--input", json.dumps(path), env=env)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "read_document reads only a file a flow sent with its call" in refused.stdout
    assert len(ledger(effects)) == 1


@pytest.mark.parametrize(
    ("declared", "refusal"),
    [
        (["a.b"], "is not one argument's name"),
        (["${path}"], "is not one argument's name"),
        ([3], "is not one argument's name"),
        (["path", "path"], "names one argument twice"),
        (["other"], "does not declare as a string property"),
    ],
)
def test_a_bad_file_input_declaration_is_refused_naming_the_tool(declared, refusal) -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    with pytest.raises(ValueError, match=refusal) as caught:

        async def handler(tool_input, call):
            return None

        Tool(
            name="reader",
            description="reads",
            effect=Effect.READ,
            input_schema=schema,
            handler=handler,
            file_inputs=tuple(declared),
        )
    assert "tool 'reader'" in str(caught.value)
    assert check_file_inputs("x", ["path"], schema) == ("path",)


def test_a_tool_reads_a_baseline_the_run_captured_earlier_and_then_the_one_written_back(
    remote: Remote,
) -> None:
    project = remote.project
    baseline = os.path.realpath(project.flows) + "/__baselines__/main/table.json"
    flow = project.flow(
        _flow(
            _read("first", str(project.document)),
            "{id: snap, kind: snapshot, name: table, of: $nodes.first.json}",
            _read("again", baseline),
        ).replace("edges: []", "edges:\n  - {from: first, to: snap}\n  - {from: snap, to: again}")
    )
    updated = salvor_in_process(
        "graph",
        "run",
        str(flow),
        "--remote",
        remote.daemon.base_url,
        "--json",
        "--update-baselines",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert updated.returncode == 0, updated.stdout + updated.stderr
    result = json.loads(updated.stdout)
    # No file at the path yet: the tool read what the snapshot captured earlier in the run.
    assert result["output"]["again"]["json"] == DOCUMENT
    assert json.loads(Path(baseline).read_text()) == DOCUMENT  # and the client wrote it

    compared = remote.run(flow)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert json.loads(compared.stdout)["output"]["again"]["json"] == DOCUMENT


def test_a_nested_flows_tool_node_and_a_maps_tool_body_read_the_clients_files(
    remote: Remote,
) -> None:
    project = remote.project
    notes = project.root / "data" / "notes.TXT"
    notes.write_text("low tide at noon")
    project.flow(_flow(_read("inner_doc", str(project.document))), name="inner")
    body = f"{{kind: tool, tool: read_document, input: {{path: {json.dumps(str(notes))}}}}}"
    flow = project.flow(
        _flow(
            "{id: nested, kind: flow, flow: inner}",
            f"{{id: each, kind: map, over: $input, body: {body}}}",
        )
    )
    done = salvor_in_process(
        "graph",
        "run",
        str(flow),
        "--remote",
        remote.daemon.base_url,
        "--json",
        "--input",
        "[1, 2]",
        env={"PATH": "/usr/bin:/bin", "SALVOR_FLOW_FILES_LOG": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    output = json.loads(done.stdout)["output"]
    assert output["nested"]["inner_doc"]["json"] == DOCUMENT
    assert [item["text"] for item in output["each"]] == ["low tide at noon"] * 2
    assert f"[flow-files] tool {notes}: inline" in done.stderr
    assert f"[flow-files] tool {project.document}: inline" in done.stderr
    assert all(
        entry["opened"] not in (str(notes), str(project.document))
        for entry in (ledger(remote.effects))
    )
