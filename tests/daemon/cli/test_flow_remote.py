"""A flow run over a link, end to end: ``salvor graph run FILE --remote URL`` against a real
`salvor serve` whose working directory is an empty directory of its own, and the ndjson stream
``POST /v1/graph-runs`` answers with (read by httpx and by ``curl -N``).

The project holds an agent file with its prompt file, a nested flow with an agent file of its
own, and a snapshot; the model is the scripted provider, which counts every call.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from salvor.daemon.cli._baselines import write_baselines
from salvor.daemon.cli._flow_collect import collect_flow
from salvor.daemon.graphs import flow_child_id
from salvor.protocol import call_body

from tests.chaos.test_kill_serve import TOKEN_VAR, Daemon, agent_toml
from tests.support.cli import salvor_in_process
from tests.support.daemon_apart import daemon_apart
from tests.support.ports import free_port
from tests.support.scripted_provider import ProviderCall, ScriptedProvider
from tests.support.spawn import CLI

SETTLE_SECONDS = 60.0

MAIN = """\
schema_version: 1
nodes:
  - {id: answer, kind: agent, agent_file: ../../agents/echo.toml}
  - {id: check, kind: snapshot, name: reply, of: $nodes.answer}
  - {id: nested, kind: flow, flow: inner, input: $nodes.answer}
edges:
  - {from: answer, to: check}
  - {from: check, to: nested}
"""

INNER = """\
schema_version: 1
nodes:
  - {id: echoed, kind: agent, agent_file: ../../agents/echo.toml}
  - {id: given, kind: snapshot, name: given, of: $nodes.echoed}
edges:
  - {from: echoed, to: given}
"""


def _echo(call: ProviderCall):
    text = call.request["messages"][0]["content"][0]["text"]
    answer = {"model": call.request["model"], "content": [{"type": "text", "text": f"<{text}>"}]}
    return {**answer, "stop_reason": "end_turn"}, {"input_tokens": 3, "output_tokens": 2}


def _agent(base_url: str) -> str:
    return (
        'name = "echo"\nmodel = "scripted"\nmax_response_tokens = 256\n'
        'system_prompt_path = "prompts/echo.txt"\n'
        f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\nmax_retries = 0\n'
        "timeout_seconds = 30\n"
    )


def _project(tmp_path: Path, base_url: str) -> Path:
    project = tmp_path / "proj"
    flows = project / ".salvor" / "flows"
    flows.mkdir(parents=True)
    (project / "agents" / "prompts").mkdir(parents=True)
    (project / "agents" / "echo.toml").write_text(_agent(base_url))
    (project / "agents" / "prompts" / "echo.txt").write_text("You echo.")
    (flows / "main.yaml").write_text(MAIN)
    (flows / "inner.yaml").write_text(INNER)
    return project


class Remote:
    def __init__(self, tmp_path: Path, daemon: Daemon, provider: ScriptedProvider) -> None:
        self.tmp_path = tmp_path
        self.daemon = daemon
        self.provider = provider
        self.project = _project(tmp_path, provider.base_url)
        self.flow = self.project / ".salvor" / "flows" / "main.yaml"
        self.baselines = self.project / ".salvor" / "flows" / "__baselines__"

    def run(self, run_input: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return salvor_in_process(
            "graph",
            "run",
            str(self.flow),
            "--remote",
            self.daemon.base_url,
            "--input",
            run_input,
            *flags,
            env={"PATH": "/usr/bin:/bin"},
        )


@pytest.fixture
def remote(tmp_path: Path, store_url: str):
    """A real daemon in a directory of its own, the scripted provider, and the project."""
    with ScriptedProvider(_echo) as provider:
        daemon = daemon_apart(tmp_path, store_url, provider)
        daemon.start()
        try:
            yield Remote(tmp_path, daemon, provider)
        finally:
            daemon.kill()


def _lines(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def test_the_stream_carries_started_each_node_of_the_run_and_its_child_then_the_result(
    remote: Remote,
) -> None:
    files = collect_flow(str(remote.flow), update_baselines=True)
    body = {**call_body(files.bundle, dict(files.contents)), "input": "tide"}
    headers = {"Accept": "application/x-ndjson"}
    with remote.daemon.client(timeout=SETTLE_SECONDS) as client:
        response = client.post("/v1/graph-runs", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.headers["cache-control"] == "no-cache, no-transform"
    assert response.headers["x-accel-buffering"] == "no"
    lines = _lines(response.content)
    assert lines[0]["type"] == "started"
    run_id = lines[0]["run"]
    child = flow_child_id(run_id, "nested")
    nodes = [
        (line["run"], line["node"], line["status"]) for line in lines if line["type"] == "node"
    ]
    assert nodes == [
        (run_id, "answer", "entered"),
        (run_id, "answer", "finished"),
        (run_id, "check", "entered"),
        (run_id, "check", "finished"),
        (run_id, "nested", "entered"),
        (child, "echoed", "entered"),
        (child, "echoed", "finished"),
        (child, "given", "entered"),
        (child, "given", "finished"),
        (run_id, "nested", "finished"),
    ]
    result = lines[-1]
    assert result["type"] == "result" and result["run"] == run_id
    assert result["status"] == "completed" and result["detail"]["state"] == "completed"
    assert result["output"] == {"nested": {"given": "<<tide>>"}}
    flows = os.path.realpath(remote.project / ".salvor" / "flows")
    writes = {w["path"]: base64.b64decode(w["content"]) for w in result["baseline_writes"]}
    assert writes == {
        f"{flows}/__baselines__/main/reply.json": b'"<tide>"\n',
        f"{flows}/__baselines__/nested/given.json": b'"<<tide>>"\n',
    }
    assert {w["encoding"] for w in result["baseline_writes"]} == {"base64"}
    # The daemon opened no path of the project's: nothing was written anywhere but the answer.
    assert not remote.baselines.exists()

    # curl -N reads the same stream; a run that does not update baselines hands none back.
    (remote.tmp_path / "body.json").write_text(json.dumps({**body, "update_baselines": False}))
    curl = subprocess.run(
        [
            "curl",
            "-sS",
            "-N",
            "-D",
            "-",
            "-H",
            "Accept: application/x-ndjson",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            f"@{remote.tmp_path / 'body.json'}",
            f"{remote.daemon.base_url}/v1/graph-runs",
        ],
        capture_output=True,
        timeout=SETTLE_SECONDS,
        check=True,
    )
    head, _, streamed = curl.stdout.partition(b"\r\n\r\n")
    assert b"HTTP/1.1 200" in head and b"content-type: application/x-ndjson" in head.lower()
    lines = _lines(streamed)
    assert lines[0]["type"] == "started" and lines[-1]["type"] == "result"
    assert lines[-1]["status"] == "failed"  # comparing, with no baseline yet
    assert "has no baseline" in lines[-1]["error"] and lines[-1]["baseline_writes"] == []


def test_a_refusal_is_still_the_json_envelope_and_records_nothing(remote: Remote) -> None:
    files = collect_flow(str(remote.flow))
    body = call_body(files.bundle, dict(files.contents))
    body["members"] = [m for m in body["members"] if m["role"] != "agent"]
    headers = {"Accept": "application/x-ndjson"}
    with remote.daemon.client(timeout=SETTLE_SECONDS) as client:
        response = client.post("/v1/graph-runs", json=body, headers=headers)
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == "application/json"
        assert response.json()["error"]["code"] == "invalid_graph"
        assert client.get("/v1/runs").json()["runs"] == []


def test_remote_update_then_compare_writes_the_baselines_here_and_fails_on_a_change(
    remote: Remote,
) -> None:
    updated = remote.run('"hello"', "--update-baselines")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    out = updated.stdout.splitlines()
    assert "node answer entered" in out and "node echoed finished" in out
    assert out[-1].startswith(f"run {out[0]} completed: ")
    assert json.loads((remote.baselines / "main" / "reply.json").read_text()) == "<hello>"
    assert json.loads((remote.baselines / "nested" / "given.json").read_text()) == "<<hello>>"
    assert list(remote.daemon.cwd.iterdir()) == []
    update_calls = len(remote.provider.calls)

    compared = remote.run('"hello"', "--json")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    result = json.loads(compared.stdout)
    assert result["status"] == "completed" and result["baseline_writes"] == []
    assert result["output"] == {"nested": {"given": "<<hello>>"}}
    assert len(remote.provider.calls) == 2 * update_calls

    changed = remote.run('"goodbye"')
    assert changed.returncode == 3, changed.stdout + changed.stderr
    assert "snapshot 'reply' differs from its baseline" in changed.stdout
    assert json.loads((remote.baselines / "main" / "reply.json").read_text()) == "<hello>"


def test_a_refused_baseline_write_exits_1_naming_it(remote: Remote) -> None:
    remote.baselines.mkdir()
    elsewhere = remote.tmp_path / "elsewhere"
    elsewhere.mkdir()
    (remote.baselines / "main").symlink_to(elsewhere)
    updated = remote.run('"hello"', "--update-baselines")
    assert updated.returncode == 1, updated.stdout + updated.stderr
    assert "baseline not written: " in updated.stderr and "reply.json" in updated.stderr
    assert list(elsewhere.iterdir()) == []
    assert json.loads((remote.baselines / "nested" / "given.json").read_text()) == "<<hello>>"


def test_a_daemon_facing_a_flow_without_members_says_to_update_the_client(remote: Remote) -> None:
    files = collect_flow(str(remote.flow))
    body = call_body(files.bundle, dict(files.contents))
    del body["members"]
    with remote.daemon.client(timeout=SETTLE_SECONDS) as client:
        response = client.post("/v1/graph-runs", json=body)
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert "node 'answer' runs an agent file" in message
        assert "node 'check' holds a snapshot" in message
        assert "update the salvor client" in message
        assert client.get("/v1/runs").json()["runs"] == []


def test_an_unreachable_daemon_and_a_bad_url_are_one_sentence(remote: Remote) -> None:
    remote.daemon.kill()
    gone = remote.run('"hello"')
    assert gone.returncode == 1
    assert gone.stderr.startswith("salvor: cannot reach the daemon at ") and "nothing was sent" in (
        gone.stderr
    )
    assert len(gone.stderr.strip().splitlines()) == 1
    usage = salvor_in_process("graph", "run", str(remote.flow), "--remote", "ftp://x")
    assert usage.returncode == 2 and "must be an http:// or https:// URL" in usage.stderr


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_connection_dropped_mid_flow_is_never_sent_again_and_a_restart_finishes_the_flow(
    tmp_path: Path, store_url: str
) -> None:
    release = threading.Event()

    def held(call: ProviderCall):
        if call.index == 1:  # the nested flow's agent: held until the daemon is gone
            release.wait(SETTLE_SECONDS)
        return _echo(call)

    with ScriptedProvider(held) as provider:
        daemon = daemon_apart(tmp_path, store_url, provider)
        daemon.start()
        try:
            remote = Remote(tmp_path, daemon, provider)
            env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
            client = subprocess.Popen(
                [*CLI, "graph", "run", str(remote.flow), "--remote", daemon.base_url]
                + ["--input", '"hello"', "--update-baselines"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            # Killed once the client has shown the nested flow's agent entered (its call held).
            shown = []
            while "node echoed entered" not in shown:
                line = client.stdout.readline()
                assert line, "the client ended before the nested flow's node entered"
                shown.append(line.strip())
            _wait(lambda: len(provider.calls) == 2, "the nested flow's model call")
            daemon.kill()
            out, err = client.communicate(timeout=SETTLE_SECONDS)
            out = "\n".join(shown) + "\n" + out
            assert client.returncode == 1, out + err
            run_id = out.splitlines()[0]
            assert "node echoed entered" in out
            assert "closed before the flow finished" in err and "it may have run" in err
            assert f"{daemon.base_url}/v1/runs/{run_id}/events" in err
            assert not remote.baselines.exists()  # no result, no baseline written
            assert len(provider.calls) == 2  # the call was not sent again
            release.set()

            # The project is gone; a restarted daemon finishes the flow from what it kept.
            shutil.rmtree(remote.project)
            daemon.start()
            with daemon.client(timeout=SETTLE_SECONDS) as http:

                def status() -> dict:
                    return http.get(f"/v1/runs/{run_id}").json()["status"]

                _wait(lambda: status()["state"] == "completed", "the run to complete")
                assert status()["output"] == {"nested": {"given": "<<hello>>"}}
            # The held call was cut by the kill and issued once more; nothing else was repeated.
            assert len(provider.calls) == 3
        finally:
            release.set()
            daemon.kill()


def test_an_old_client_sending_a_graph_by_hash_that_needs_files_is_told_to_update(
    remote: Remote,
) -> None:
    document = {
        "schema_version": 1,
        "nodes": [{"id": "answer", "kind": "agent", "agent_file": "../../agents/echo.toml"}],
        "edges": [],
    }
    with remote.daemon.client(timeout=SETTLE_SECONDS) as client:
        stored = client.post("/v1/graphs", json=document)
        assert stored.status_code == 201, stored.text
        response = client.post(
            "/v1/graph-runs",
            json={"graph_hash": stored.json()["graph"]},
            headers={"Accept": "application/x-ndjson"},
        )
        assert response.status_code == 400, response.text
        assert "update the salvor client" in response.json()["error"]["message"]


# The last commit before daemons read a flow's members (its capabilities list no flow_members).
OLD_DAEMON_COMMIT = "ac943e2aa989fd74a3fab87412a3d94d11bfeca3"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def old_daemon(tmp_path: Path):
    """Starts a real `salvor serve` of ``OLD_DAEMON_COMMIT`` (its tree from this repository's
    history, laid out as the installed package) on an SQLite store of its own: its URL."""
    source = tmp_path / "old-src"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", OLD_DAEMON_COMMIT],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        pytest.skip(f"this checkout lacks {OLD_DAEMON_COMMIT} (a shallow clone?)")
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    site = tmp_path / "old-site"
    shutil.copytree(source / "salvor_ns", site / "salvor")
    for part in ("protocol", "store", "daemon"):
        shutil.copytree(source / part, site / "salvor" / part)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
    env["PYTHONPATH"] = str(site)
    home = tmp_path / "old-home"
    home.mkdir()
    store = f"sqlite:///{tmp_path / 'old.db'}"
    processes = []

    def serve(*args: str) -> str:
        port = free_port()
        with open(tmp_path / "old-serve.log", "wb") as log:
            process = subprocess.Popen(
                [*CLI, "serve", "--listen", f"127.0.0.1:{port}", "--store", store, *args],
                env=env,
                cwd=home,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        processes.append(process)
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert process.poll() is None, (tmp_path / "old-serve.log").read_text()
            try:
                return httpx.get(f"{url}/v1/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        _wait(up, "the old daemon to serve")
        capabilities = httpx.get(f"{url}/v1/capabilities").json()["capabilities"]
        assert "flow_members" not in capabilities
        return url

    try:
        yield serve
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_a_daemon_without_flow_members_gets_the_graph_by_hash_and_no_flow_that_needs_files(
    tmp_path: Path, old_daemon
) -> None:
    with ScriptedProvider(_echo) as provider:
        old_daemon = old_daemon("--model-endpoint", provider.base_url)
        project = _project(tmp_path, provider.base_url)
        flow = project / ".salvor" / "flows" / "main.yaml"
        refused = salvor_in_process(
            "graph", "run", str(flow), "--remote", old_daemon, env={"PATH": "/usr/bin:/bin"}
        )
        assert refused.returncode == 1 and refused.stdout == ""
        assert "does not take a flow's files with the call" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert httpx.get(f"{old_daemon}/v1/runs").json()["runs"] == []

        agent = tmp_path / "echo.toml"
        agent.write_text(agent_toml(provider.base_url, name="echo", tools=[]))
        registered = httpx.post(
            f"{old_daemon}/v1/agents",
            content=agent.read_bytes(),
            headers={"Content-Type": "application/toml"},
        )
        graph = tmp_path / "plain.yaml"
        node = {"id": "ask", "kind": "agent", "agent": registered.json()["agent"]}
        graph.write_text(json.dumps({"schema_version": 1, "nodes": [node], "edges": []}))
        ran = salvor_in_process(
            "graph",
            "run",
            str(graph),
            "--remote",
            old_daemon,
            "--agent",
            str(agent),
            "--input",
            '"tide"',
            env={"PATH": "/usr/bin:/bin"},
        )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout.splitlines()
    assert out[1:3] == ["node ask entered", "node ask finished"]
    assert out[-1] == f'run {out[0]} completed: {{"ask": "<tide>"}}'


def test_a_daemon_that_cannot_see_the_project_runs_it_from_the_call(
    tmp_path: Path, store_url: str
) -> None:
    """The daemon runs in a mount namespace of its own with an empty tmpfs over the project."""
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("this user cannot make a mount namespace (unshare --mount)")
    with ScriptedProvider(_echo) as provider:
        project = _project(tmp_path, provider.base_url)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
        home = tmp_path / "daemon-home"
        home.mkdir()
        hide = 'mount -t tmpfs tmpfs "$1" && shift && exec "$@"'
        serve = [*CLI, "serve", "--listen", f"127.0.0.1:{port}", "--store", store_url]
        serve += ["--model-endpoint", provider.base_url, "--workers", "1", "--demo-tools"]
        with open(tmp_path / "hidden-serve.log", "wb") as log:
            daemon = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide, "sh"]
                + [str(project), *serve],
                env=env,
                cwd=home,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        try:

            def up() -> bool:
                assert daemon.poll() is None, (tmp_path / "hidden-serve.log").read_text()
                try:
                    return httpx.get(f"{url}/v1/health", timeout=1).status_code == 200
                except httpx.TransportError:
                    return False

            _wait(up, "the daemon to serve")
            # What the daemon's process sees at the project's path: nothing.
            assert os.listdir(f"/proc/{daemon.pid}/root{project}") == []
            flow = str(project / ".salvor" / "flows" / "main.yaml")
            args = ("graph", "run", flow, "--remote", url, "--input", '"bees"')
            env = {"PATH": "/usr/bin:/bin"}
            updated = salvor_in_process(*args, "--update-baselines", env=env)
            assert updated.returncode == 0, updated.stdout + updated.stderr
            baselines = project / ".salvor" / "flows" / "__baselines__"
            assert json.loads((baselines / "nested" / "given.json").read_text()) == "<<bees>>"
            compared = salvor_in_process(*args, env=env)
            assert compared.returncode == 0, compared.stdout + compared.stderr
            assert compared.stdout.splitlines()[-1].endswith('{"nested": {"given": "<<bees>>"}}')
            # Three levels of flows (the deepest with its agent file and prompt), a snapshot at
            # the top and one at the bottom, and a tool reading a file of the client's.
            deep = _deep_flows(project)
            deep_args = ("graph", "run", deep, "--remote", url)
            updated = salvor_in_process(*deep_args, "--update-baselines", env=env)
            assert updated.returncode == 0, updated.stdout + updated.stderr
            assert json.loads((baselines / "again" / "given.json").read_text()) == "<tide tables>"
            compared = salvor_in_process(*deep_args, env=env)
            assert compared.returncode == 0, compared.stdout + compared.stderr
            assert '"<tide tables>"' in compared.stdout.splitlines()[-1]
            (project / "data" / "tides.json").write_text(json.dumps({"title": "neap tides"}))
            changed = salvor_in_process(*deep_args, env=env)
            assert changed.returncode == 3 and "differs from its baseline" in changed.stdout, (
                changed.stdout + changed.stderr
            )
        finally:
            daemon.kill()
            daemon.wait()


def _deep_flows(project: Path) -> str:
    """``deep.yaml``: a tool node reading ``data/tides.json`` of the project, then ``middle``
    (which runs ``inner``: agent file, prompt, snapshot), then a snapshot of it all."""
    (project / "data").mkdir()
    tides = project / "data" / "tides.json"
    tides.write_text(json.dumps({"title": "tide tables"}))
    flows = project / ".salvor" / "flows"
    deep = {
        "schema_version": 1,
        "nodes": [
            {"id": "doc", "kind": "tool", "tool": "read_document", "input": {"path": str(tides)}},
            {"id": "outer", "kind": "flow", "flow": "middle", "input": "$nodes.doc.json.title"},
            {"id": "check", "kind": "snapshot", "name": "deep", "of": "$nodes.outer"},
        ],
        "edges": [{"from": "doc", "to": "outer"}, {"from": "outer", "to": "check"}],
    }
    middle = {
        "schema_version": 1,
        "nodes": [{"id": "again", "kind": "flow", "flow": "inner", "input": "$input"}],
        "edges": [],
    }
    (flows / "deep.yaml").write_text(json.dumps(deep))
    (flows / "middle.yaml").write_text(json.dumps(middle))
    return str(flows / "deep.yaml")


def test_the_bearer_token_comes_from_salvor_token_never_an_argument(
    tmp_path: Path, store_url: str
) -> None:
    with ScriptedProvider(_echo) as provider:
        daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
        daemon.env[TOKEN_VAR] = token = "a-token-of-the-operator-0123456789"
        daemon.args += ["--auth-token", TOKEN_VAR, "--model-endpoint", provider.base_url]
        daemon.start()
        try:
            remote = Remote(tmp_path, daemon, provider)
            refused = remote.run('"hello"')
            assert refused.returncode == 1 and "unauthorized" in refused.stderr
            assert token not in refused.stderr
            ran = salvor_in_process(
                "graph",
                "run",
                str(remote.flow),
                "--remote",
                daemon.base_url,
                env={"PATH": "/usr/bin:/bin", "SALVOR_TOKEN": token},
            )
            # It ran (and failed its snapshot: no baseline was ever captured).
            assert ran.returncode == 3, ran.stdout + ran.stderr
            assert "has no baseline" in ran.stdout
        finally:
            daemon.kill()


def test_a_refused_flow_is_one_sentence_naming_each_node_and_exit_1(remote: Remote) -> None:
    (remote.project / "agents" / "echo.toml").unlink()
    refused = remote.run('"hello"')
    assert refused.returncode == 1 and refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the run, invalid_graph" in lines[0]
    assert "answer: " in lines[0] and "echoed: " in lines[0]


def test_the_client_writes_a_png_baseline_only_when_it_is_one(tmp_path: Path) -> None:
    project = _project(tmp_path, "http://127.0.0.1:9")
    files = collect_flow(str(project / ".salvor" / "flows" / "main.yaml"), update_baselines=True)
    directory = os.path.realpath(project / ".salvor" / "flows") + "/__baselines__/main"
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
    refused = write_baselines(
        files,
        {
            f"{directory}/home.png": png,
            f"{directory}/fake.png": b"GIF89a",
            f"{directory}/notes.txt": b"x",
            f"{directory}/../main/reply.json": b"1\n",
        },
    )
    assert (Path(directory) / "home.png").read_bytes() == png
    assert sorted(os.listdir(directory)) == ["home.png"]
    assert len(refused) == 3
    assert any("fake.png: a .png baseline must hold a PNG image" in r for r in refused)
