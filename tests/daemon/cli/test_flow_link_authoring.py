"""Authoring over a link, end to end: ``salvor graph run FILE --remote URL`` against a real
`salvor serve` in a directory of its own runs a flow whose built-in agent (edit mode on, the
scripted provider) calls ``flow_agents`` write and ``flow_write``. What it writes lands in the
client's project, by the client; the daemon's directory stays empty and nothing is registered
there. What a linked run would refuse is refused before anything counts as written: a process
agent, and a flow naming process agents and a file outside the project (each problem listed).

A hostile daemon (a small loopback server speaking the stream) cannot make the client write
outside its project's ``.salvor/flows`` and ``.salvor/agents``; and a daemon SIGKILLed after the
write keeps it in the run's log, where a restarted daemon reads it back.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trio
from salvor.daemon.graphs import saved_client_files
from salvor.store import EventStore

from tests.chaos.test_kill_serve import TOKEN_VAR, Daemon
from tests.support.cli import salvor_in_process
from tests.support.daemon_apart import daemon_apart
from tests.support.flows import tool_results, tool_use
from tests.support.scripted_provider import ProviderCall, ScriptedProvider, text_reply

SETTLE_SECONDS = 60.0

AUTHOR_FLOW = """\
schema_version: 1
nodes:
  - {id: author, kind: agent, agent_file: ../../agents/author.toml, input: "write them"}
edges: []
"""
MADE = """\
schema_version: 1
nodes:
  - {id: help, kind: agent, agent_file: ../agents/helper.md, input: "help me"}
edges: []
"""
PROCESS_AGENT = 'name = "runner"\nkind = "process"\ncommand = ["/bin/true"]\n'


def _author(base_url: str) -> str:
    return (
        'name = "author"\nmodel = "scripted"\nmax_response_tokens = 256\n'
        'flow_tools = ["flow_write", "flow_agents"]\nsystem_prompt = "You author."\n'
        f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\nmax_retries = 0\n'
        "timeout_seconds = 30\n"
    )


def _helper(base_url: str) -> str:
    return (
        "---\nname: helper\ndescription: Helps.\nmodel: scripted\nllm:\n  provider: anthropic\n"
        f"  base_url: {base_url}\n  max_retries: 0\n---\nYou help.\n"
    )


def _bad_flow(first: str, second: str) -> str:
    return (
        "schema_version: 1\nnodes:\n"
        f"  - {{id: first, kind: agent, agent: '{first}'}}\n"
        f"  - {{id: second, kind: agent, agent: '{second}'}}\n"
        "  - {id: third, kind: agent, agent_file: ../../../elsewhere/x.md}\n"
        "edges: []\n"
    )


class Script:
    """The author's turns, by how many tool results its conversation holds; the helper's one."""

    def __init__(self) -> None:
        self.turns: list = []

    def __call__(self, call: ProviderCall):
        if "You help." in json.dumps(call.request.get("system")):
            return text_reply("helped")
        return self.turns[len(tool_results(call))]


def _project(tmp_path: Path, base_url: str) -> Path:
    project = tmp_path / "proj"
    (project / ".salvor" / "flows").mkdir(parents=True)
    (project / "agents").mkdir()
    (project / "agents" / "author.toml").write_text(_author(base_url))
    (project / ".salvor" / "flows" / "author.yaml").write_text(AUTHOR_FLOW)
    return project


@pytest.fixture
def linked(tmp_path: Path, store_url: str):
    """A real daemon in an empty directory of its own (edit mode on, process agents allowed,
    so two can be registered for a graph to name), the scripted provider, the project."""
    script = Script()
    with ScriptedProvider(script) as provider:
        daemon = daemon_apart(tmp_path, store_url, provider)
        daemon.allow_process_agents()
        daemon.start()
        try:
            with daemon.client(timeout=SETTLE_SECONDS) as client:
                edit = client.put("/v1/settings/edit-mode", json={"enabled": True})
                assert edit.status_code == 200, edit.text
            yield daemon, provider, script, _project(tmp_path, provider.base_url)
        finally:
            daemon.kill()


def _remote(daemon: Daemon, flow: Path, *flags: str):
    env = {"PATH": "/usr/bin:/bin", "SALVOR_TOKEN": daemon.env[TOKEN_VAR]}
    args = ("graph", "run", str(flow), "--remote", daemon.base_url, *flags)
    return salvor_in_process(*args, env=env)


def _register_process_agents(daemon: Daemon) -> list[str]:
    hashes = []
    with daemon.client(timeout=SETTLE_SECONDS) as client:
        for name in ("one", "two"):
            definition = PROCESS_AGENT.replace("runner", name)
            definition = definition.replace("/bin/true", sys.executable)
            response = client.post(
                "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
            )
            assert response.status_code in (200, 201), response.text
            hashes.append(response.json()["agent"])
    return hashes


def test_authoring_over_the_link_saves_on_the_client_and_refuses_what_a_link_would(
    linked,
) -> None:
    daemon, provider, script, project = linked
    first, second = _register_process_agents(daemon)
    script.turns = [
        tool_use("flow_agents", {"op": "write", "content": _helper(provider.base_url)}),
        tool_use("flow_write", {"name": "made", "content": MADE}),
        tool_use("flow_agents", {"op": "write", "content": PROCESS_AGENT}),
        tool_use("flow_write", {"name": "bad", "content": _bad_flow(first, second)}),
        text_reply("authored"),
    ]
    ran = _remote(daemon, project / ".salvor" / "flows" / "author.yaml")
    assert ran.returncode == 0, ran.stdout + ran.stderr

    real = os.path.realpath(project)
    helper = f"{real}/.salvor/agents/helper.md"
    made = f"{real}/.salvor/flows/made.yaml"
    out = ran.stdout.splitlines()
    assert out[-3].startswith(f"run {out[0]} completed: ")
    assert out[-2:] == [f"wrote {helper}", f"wrote {made}"]
    assert Path(helper).read_text() == _helper(provider.base_url)
    assert Path(made).read_text() == MADE
    assert sorted(os.listdir(f"{real}/.salvor/agents")) == ["helper.md"]
    assert sorted(os.listdir(f"{real}/.salvor/flows")) == ["author.yaml", "made.yaml"]
    # The daemon wrote no file and registered neither the agent nor the flow.
    assert list(daemon.cwd.iterdir()) == []
    with daemon.client(timeout=SETTLE_SECONDS) as client:
        names = {agent.get("name") for agent in client.get("/v1/agents").json()["agents"]}
        assert "author" in names and "helper" not in names
        graphs = client.get("/v1/graphs").json()["graphs"]
        made_hash = json.loads(tool_results(provider.calls[-1])[1]["content"])["graph"]
        assert made_hash not in {graph["graph"] for graph in graphs}

    answers = [json.loads(r["content"]) for r in tool_results(provider.calls[-1])]
    assert answers[0]["written"] is True and answers[0]["saved_to"]["path"] == helper
    assert answers[1]["written"] is True and answers[1]["saved_to"]["path"] == made
    assert base64.b64decode(answers[1]["saved_to"]["content"]).decode() == MADE
    refused_agent, refused_flow = answers[2], answers[3]
    assert refused_agent["written"] is False and "saved_to" not in refused_agent
    (problem,) = refused_agent["diagnostics"]
    assert "process agent, whose command would run on the daemon's machine" in problem["message"]
    assert refused_flow["written"] is False and "saved_to" not in refused_flow
    errors = [d for d in refused_flow["diagnostics"] if d["severity"] == "error"]
    shown = "\n".join(d["message"] for d in errors)
    assert len(errors) == 3, shown
    assert "node 'first'" in shown and "node 'second'" in shown and "node 'third'" in shown
    assert shown.count("would run on the daemon's machine") == 2
    assert "outside every root this client serves" in shown
    assert [d["line"] for d in errors[:2]] == [3, 4]

    # The flow the agent wrote runs over the link from the client's files.
    again = _remote(daemon, Path(made))
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        again.stdout.splitlines()[-1]
        == f'run {again.stdout.splitlines()[0]} completed: {{"help": "helped"}}'
    )


OUTER = """\
schema_version: 1
nodes:
  - {id: inner, kind: flow, flow: author}
edges: []
"""


def test_a_nested_flow_inherits_the_link_and_its_writes_come_back_with_the_result(
    linked,
) -> None:
    daemon, _, script, project = linked
    script.turns = [tool_use("flow_write", {"name": "deep", "content": MADE}), text_reply("ok")]
    outer = project / ".salvor" / "flows" / "outer.yaml"
    outer.write_text(OUTER)
    ran = _remote(daemon, outer, "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout)
    deep = f"{os.path.realpath(project)}/.salvor/flows/deep.yaml"
    assert result["status"] == "completed" and result["client_files"] == [deep]
    assert Path(deep).read_text() == MADE
    with daemon.client(timeout=SETTLE_SECONDS) as client:
        runs = client.get("/v1/runs").json()["runs"]
    linked_to = {run.get("labels", {}).get("salvor.linked") for run in runs}
    assert linked_to == {os.path.realpath(project)}, runs
    assert len(runs) == 2  # the outer run and the nested flow's child, both linked


def test_a_local_run_is_offered_no_authoring_in_its_agent_nodes(linked, tmp_path: Path) -> None:
    """Without the header nothing changes: a graph's agent node is a child session."""
    daemon, provider, script, _ = linked
    script.turns = [text_reply("nothing to do")]
    files = tmp_path / "plain.json"
    with daemon.client(timeout=SETTLE_SECONDS) as client:
        agent = client.post(
            "/v1/agents",
            content=_author(provider.base_url),
            headers={"Content-Type": "application/toml"},
        ).json()["agent"]
        node = {"id": "author", "kind": "agent", "agent": agent, "input": "go"}
        files.write_text(json.dumps({"schema_version": 1, "nodes": [node], "edges": []}))
        stored = client.post("/v1/graphs", json=json.loads(files.read_text()))
        assert stored.status_code == 201, stored.text
        graph = stored.json()["graph"]
        started = client.post("/v1/graph-runs", json={"graph_hash": graph})
        assert started.status_code == 201, started.text
        run = started.json()["run"]
        deadline = time.monotonic() + SETTLE_SECONDS
        while client.get(f"/v1/runs/{run}").json()["status"]["state"] != "completed":
            assert time.monotonic() < deadline, "the run never completed"
            time.sleep(0.05)
        labels = client.get(f"/v1/runs/{run}").json().get("labels") or {}
    assert "salvor.linked" not in labels
    offered = [tool["name"] for tool in provider.calls[-1].request.get("tools", [])]
    assert "flow_write" not in offered and "flow_agents" not in offered


# -- a hostile daemon ----------------------------------------------------------------------------


def _hostile_server(directives: list[dict]) -> ThreadingHTTPServer:
    """A loopback server that answers as a daemon would, its result naming ``directives``."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/tools":
                body = json.dumps({"tools": []}).encode()
            else:
                body = json.dumps({"capabilities": {"flow_members": True}}).encode()
            self._send(200, body, "application/json")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            run = "6f1c1a52-7d8e-4f0a-9b3c-2e5d4a1b0c9f"
            lines = [
                {"type": "started", "run": run},
                {
                    "type": "result",
                    "run": run,
                    "status": "completed",
                    "detail": {"state": "completed", "output": {}},
                    "output": {},
                    "baseline_writes": [],
                    "client_files": directives,
                },
            ]
            body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
            self._send(200, body, "application/x-ndjson")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _directive(path: str, text: str) -> dict:
    return {"path": path, "content": base64.b64encode(text.encode()).decode(), "encoding": "base64"}


def test_a_hostile_daemon_gets_nothing_written_outside_the_project(tmp_path: Path) -> None:
    project = _project(tmp_path, "http://127.0.0.1:9")
    real = os.path.realpath(project)
    outside = tmp_path / "outside"
    outside.mkdir()
    (project / ".salvor" / "agents").symlink_to(outside)
    directives = [
        _directive("../../etc/x", "relative"),
        _directive(f"{real}/.salvor/flows/../../../outside/x.yaml", "climbs"),
        _directive(f"{real}/.salvor/agents/evil.md", "through a link"),
        _directive(f"{real}/.salvor/flows/deep/x.yaml", "not directly in"),
        _directive(f"{real}/.salvor/flows/x.sh", "not a flow"),
        _directive(f"{real}/.salvor/flows/ok.yaml", "fine"),
    ]
    server = _hostile_server(directives)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        flow = project / ".salvor" / "flows" / "author.yaml"
        env = {"PATH": "/usr/bin:/bin"}
        ran = salvor_in_process("graph", "run", str(flow), "--remote", url, env=env)
        as_json = salvor_in_process("graph", "run", str(flow), "--remote", url, "--json", env=env)
    finally:
        server.shutdown()
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert ran.stdout.splitlines()[-1] == f"wrote {real}/.salvor/flows/ok.yaml"
    refusals = ran.stderr.strip().splitlines()
    assert len(refusals) == 5, ran.stderr
    assert all(line.startswith("salvor: client file not written: ") for line in refusals)
    assert "evil.md: " in ran.stderr and "is a link" in ran.stderr
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "x.yaml").exists() and not Path("/etc/x").exists()
    assert sorted(os.listdir(f"{real}/.salvor/flows")) == ["author.yaml", "ok.yaml"]
    assert Path(f"{real}/.salvor/flows/ok.yaml").read_text() == "fine"

    assert as_json.returncode == 1, as_json.stdout + as_json.stderr
    result = json.loads(as_json.stdout)
    outcomes = result["client_files"]
    assert f"{real}/.salvor/flows/ok.yaml" in outcomes
    assert sum(isinstance(o, dict) and "error" in o for o in outcomes) == 5


# -- a daemon killed after the write ------------------------------------------------------------


class _Logs:
    """The reads ``saved_client_files`` makes, over a store opened by this test."""

    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def view(self, run_id: str):
        return self.store.read_view(run_id)

    async def log(self, run_id: str, from_seq: int = 0):
        return self.store.read_log(run_id, from_seq)

    async def list_runs(self, **filters):
        return self.store.list_runs(**filters)


@pytest.mark.kill
def test_a_write_survives_a_sigkill_in_the_log_and_is_never_repeated(
    tmp_path: Path, store_url: str
) -> None:
    release, seen = threading.Event(), threading.Event()
    script = Script()
    script.turns = [tool_use("flow_write", {"name": "made", "content": MADE}), text_reply("done")]

    def held(call: ProviderCall):
        if call.index == 1:  # the turn after the write: its answer is durable by now
            seen.set()
            release.wait(SETTLE_SECONDS)
        return script(call)

    with ScriptedProvider(held) as provider:
        daemon = daemon_apart(tmp_path, store_url, provider)
        daemon.start()
        try:
            with daemon.client(timeout=SETTLE_SECONDS) as client:
                client.put("/v1/settings/edit-mode", json={"enabled": True})
            project = _project(tmp_path, provider.base_url)
            flow = project / ".salvor" / "flows" / "author.yaml"
            outcome = {}

            def run() -> None:
                env = {"PATH": "/usr/bin:/bin"}
                outcome["ran"] = salvor_in_process(
                    "graph", "run", str(flow), "--remote", daemon.base_url, env=env
                )

            caller = threading.Thread(target=run)
            caller.start()
            assert seen.wait(SETTLE_SECONDS), "the turn after the write never came"
            daemon.kill()
            caller.join(SETTLE_SECONDS)
            ran = outcome["ran"]
            assert ran.returncode == 1 and "it may have run" in ran.stderr, ran.stderr
            run_id = ran.stdout.splitlines()[0]
            # No result arrived: the client wrote nothing.
            assert not (project / ".salvor" / "flows" / "made.yaml").exists()
            release.set()

            daemon.start()
            with daemon.client(timeout=SETTLE_SECONDS) as client:
                deadline = time.monotonic() + SETTLE_SECONDS
                while client.get(f"/v1/runs/{run_id}").json()["status"]["state"] != "completed":
                    assert time.monotonic() < deadline, "the run never completed"
                    time.sleep(0.05)
        finally:
            release.set()
            daemon.kill()

    with EventStore.open(store_url) as store:
        log = store.read_log(run_id)
        writes = [e for e in log if getattr(e.event, "tool", None) == "flow_write"]
        assert len(writes) == 1  # the write was recorded once and never performed again
        saved = trio.run(saved_client_files, _Logs(store), run_id)
    real = os.path.realpath(project)
    assert saved == {f"{real}/.salvor/flows/made.yaml": MADE.encode()}
    assert list((tmp_path / "daemon-home").iterdir()) == []


def test_a_linked_call_keeps_a_label_for_the_daemon_and_without_a_project_saves_nothing(
    linked,
) -> None:
    """The header on a graph by hash: linked, with no project to save into (a sentence says
    so); a caller may not set the label, and leaves room for it."""
    daemon, provider, script, _ = linked
    script.turns = [tool_use("flow_write", {"name": "made", "content": MADE}), text_reply("ok")]
    header = {"X-Salvor-Linked": "1"}
    with daemon.client(timeout=SETTLE_SECONDS) as client:
        agent = client.post(
            "/v1/agents",
            content=_author(provider.base_url),
            headers={"Content-Type": "application/toml"},
        ).json()["agent"]
        node = {"id": "author", "kind": "agent", "agent": agent, "input": "go"}
        graph = client.post("/v1/graphs", json={"schema_version": 1, "nodes": [node], "edges": []})
        call = {"graph_hash": graph.json()["graph"]}

        crowded = {**call, "labels": {f"k{i}": "v" for i in range(16)}}
        refused = client.post("/v1/graph-runs", json=crowded, headers=header)
        assert refused.status_code == 400, refused.text
        assert "at most 15 labels" in refused.json()["error"]["message"]
        taken = {**call, "labels": {"salvor.linked": "/elsewhere"}}
        refused = client.post("/v1/graph-runs", json=taken, headers=header)
        assert refused.status_code == 400, refused.text
        assert "written by the daemon alone" in refused.json()["error"]["message"]
        assert client.get("/v1/runs").json()["runs"] == []

        started = client.post("/v1/graph-runs", json=call, headers=header)
        assert started.status_code == 201, started.text
        run = started.json()["run"]
        deadline = time.monotonic() + SETTLE_SECONDS
        while client.get(f"/v1/runs/{run}").json()["status"]["state"] != "completed":
            assert time.monotonic() < deadline, "the run never completed"
            time.sleep(0.05)
        assert client.get(f"/v1/runs/{run}").json()["labels"] == {"salvor.linked": ""}
    (answer,) = [json.loads(r["content"]) for r in tool_results(provider.calls[-1])]
    assert answer["written"] is False and "saved_to" not in answer
    assert "no project on the client" in answer["diagnostics"][0]["message"]
