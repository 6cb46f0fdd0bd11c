"""Flow members sent ahead of their call: ``POST /v1/uploads`` against a real `salvor serve`
(with a token) whose working directory is an empty directory of its own, and the client's
``call_with_uploads`` building the call over real HTTP.

A flow whose members pass 256 KiB runs with some members inline and the rest uploaded; an upload
is good for one call (a second is a 422), an unknown one, a wrong hash or a wrong size refuses
the call with nothing recorded and the upload spent all the same, a body that is not one regular
file in a gzipped tar is a 422, the hourly sweep deletes an upload no call named, and a proxy's
413 on an upload makes the client stop before the call.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import httpx
import pytest
import trio
from salvor.daemon.cli._errors import CliError
from salvor.daemon.cli._flow_collect import collect_flow
from salvor.daemon.cli._flow_uploads import INLINE_BYTES, call_with_uploads
from salvor.protocol import archive_hash, pack_upload
from salvor.store import EventStore

from tests.chaos.test_kill_serve import Daemon, agent_toml
from tests.daemon.api.test_flow_link import SETTLE_SECONDS, _echo
from tests.daemon.serve.test_deploy import nginx_command, nginx_config
from tests.daemon.serve.test_lifecycle import free_port
from tests.store.test_store import execute_sql
from tests.support.api_server import TOKEN
from tests.support.cli import salvor_in_process
from tests.support.contract import UPLOAD_PATHS, Contract, below_the_free_space_floor
from tests.support.daemon_apart import daemon_apart
from tests.support.scripted_provider import ScriptedProvider

TOKEN_VAR = "SALVOR_TEST_UPLOAD_TOKEN"
# Each prompt file is big enough that the two pass the call's inline share together.
PROMPT_BYTES = 150 * 1024

FLOW = """\
schema_version: 1
nodes:
  - {id: first, kind: agent, agent_file: ../../agents/first.toml}
  - {id: second, kind: agent, agent_file: ../../agents/second.toml, input: $nodes.first}
edges:
  - {from: first, to: second}
"""


def _agent(base_url: str, name: str) -> str:
    toml = agent_toml(base_url, name=name, tools=[])
    toml = toml.replace('system_prompt = "You settle refund requests."\n', "")
    return toml.replace("[llm]", f'system_prompt_path = "{name}.txt"\n[llm]', 1)


def _project(tmp_path: Path, base_url: str) -> Path:
    """A project whose flow's members pass 256 KiB together; the flow file's path."""
    project = tmp_path / "proj"
    flows = project / ".salvor" / "flows"
    flows.mkdir(parents=True)
    agents = project / "agents"
    agents.mkdir()
    for name in ("first", "second"):
        (agents / f"{name}.toml").write_text(_agent(base_url, name))
        # Random text: the archives are as big as the files, so a small proxy limit trips.
        (agents / f"{name}.txt").write_text(secrets.token_hex(PROMPT_BYTES // 2))
    (flows / "main.yaml").write_text(FLOW)
    return flows / "main.yaml"


@pytest.fixture
def served(tmp_path: Path, store_url: str):
    """A real daemon with a bearer token, its HTTP client and the scripted provider."""
    with ScriptedProvider(_echo) as provider:
        daemon = daemon_apart(tmp_path, store_url)
        token = secrets.token_urlsafe(24)
        daemon.env[TOKEN_VAR] = token
        daemon.args += ["--model-endpoint", provider.base_url, "--auth-token", TOKEN_VAR]
        daemon.headers = {"Authorization": f"Bearer {token}"}
        daemon.start()
        try:
            with daemon.client(timeout=60) as client:
                yield daemon, client, provider
        finally:
            daemon.kill()


def _body_with_uploads(daemon: Daemon, files) -> dict:
    async def build() -> dict:
        async with httpx.AsyncClient(
            base_url=daemon.base_url, headers=daemon.headers, timeout=60
        ) as client:
            return await call_with_uploads(client, files.bundle, dict(files.contents))

    return trio.run(build)


def _upload(client: httpx.Client, archive: bytes, content_type: str = "application/gzip"):
    return client.post("/v1/uploads", content=archive, headers={"Content-Type": content_type})


def _error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    return body["error"]


def _settled(client: httpx.Client, run_id: str) -> dict:
    deadline = time.monotonic() + SETTLE_SECONDS
    resting = ("completed", "failed", "abandoned", "suspended", "needs_reconciliation")
    while (status := client.get(f"/v1/runs/{run_id}").json()["status"])["state"] not in resting:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    return status


def test_a_flow_past_256_kib_runs_with_members_inline_and_uploaded(
    tmp_path: Path, served, monkeypatch, capsys
) -> None:
    daemon, client, provider = served
    monkeypatch.setenv("SALVOR_FLOW_FILES_LOG", "1")
    files = collect_flow(str(_project(tmp_path, provider.base_url)), over_link=True)
    shutil.rmtree(tmp_path / "proj")
    body = _body_with_uploads(daemon, files)
    inline = [m for m in body["members"] if "content" in m]
    uploaded = [m for m in body["members"] if "upload_id" in m]
    assert inline and uploaded and "content" in body["flow"]
    assert sum(m["size"] for m in inline) <= INLINE_BYTES < sum(m["size"] for m in body["members"])
    for member in uploaded:
        assert set(member) >= {"upload_id", "content_hash", "size"} and "content" not in member
        assert member["upload_id"].startswith("upl_") and len(member["upload_id"]) == 36
    # The log said beforehand which way each member goes, as the call sends it.
    lines = capsys.readouterr().err.splitlines()
    for member in body["members"]:
        how = "upload" if "upload_id" in member else "inline"
        shown = member["canonical"]
        assert f"[flow-files] {member['role']} {shown}: {how} {member['size']}" in lines

    started = client.post("/v1/graph-runs", json={**body, "input": "tide"})
    assert started.status_code == 201, started.text
    status = _settled(client, started.json()["run"])
    assert status == {"state": "completed", "output": {"second": "<<tide>>"}}
    # Each prompt (a member, uploaded or not) reached the model as the agent's system prompt.
    systems = [call.request["system"] for call in provider.calls]
    prompts = [m for m in files.bundle.members.values() if m.role == "prompt"]
    assert len(prompts) == 2 and len(systems) == 2
    for prompt in prompts:
        assert any(files.contents[prompt.sha256].decode() in system for system in systems)
    # The uploads were spent by that call: the same body again is refused, nothing recorded.
    runs = client.get("/v1/runs").json()["runs"]
    error = _error(client.post("/v1/graph-runs", json=body), 422, "invalid_flow_files")
    assert "does not hold" in error["message"]
    assert client.get("/v1/runs").json()["runs"] == runs


def test_graph_run_remote_sends_the_members_past_256_kib_ahead_by_upload(
    tmp_path: Path, served
) -> None:
    daemon, _, provider = served
    flow = _project(tmp_path, provider.base_url)
    env = {
        "PATH": "/usr/bin:/bin",
        "SALVOR_TOKEN": daemon.headers["Authorization"].removeprefix("Bearer "),
        "SALVOR_FLOW_FILES_LOG": "1",
    }
    done = salvor_in_process(
        "graph",
        "run",
        str(flow),
        "--remote",
        daemon.base_url,
        "--input",
        '"tide"',
        "--json",
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed" and result["output"] == {"second": "<<tide>>"}
    # The command laid the members out as call_with_uploads does: some went ahead by upload.
    assert any(": upload " in line for line in done.stderr.splitlines()), done.stderr
    assert any(": inline " in line for line in done.stderr.splitlines()), done.stderr
    assert len(provider.calls) == 2


def test_an_upload_named_wrongly_refuses_the_call_and_is_spent_all_the_same(
    tmp_path: Path, served
) -> None:
    daemon, client, provider = served
    files = collect_flow(str(_project(tmp_path, provider.base_url)))
    body = _body_with_uploads(daemon, files)
    index = next(i for i, m in enumerate(body["members"]) if "upload_id" in m)

    def sent(change) -> httpx.Response:
        call = json.loads(json.dumps(body))
        change(call["members"][index])
        return client.post("/v1/graph-runs", json=call)

    def unknown(member: dict) -> None:
        member["upload_id"] = "upl_" + "0" * 32

    assert "does not hold" in _error(sent(unknown), 422, "invalid_flow_files")["message"]

    def wrong_hash(member: dict) -> None:
        member["content_hash"] = "0" * 64

    error = _error(sent(wrong_hash), 422, "invalid_flow_files")
    assert "content_hash" in error["message"]
    # Refused, and spent: the upload the refused call named is gone.
    error = _error(client.post("/v1/graph-runs", json=body), 422, "invalid_flow_files")
    assert "does not hold" in error["message"]

    def fresh_upload() -> None:
        member = body["members"][index]
        archive = pack_upload("second.txt", files.contents[_digest(files, member)])
        kept = _upload(client, archive)
        assert kept.status_code == 201, kept.text
        assert kept.json() == {
            "upload_id": kept.json()["upload_id"],
            "content_hash": archive_hash(archive),
            "size": len(archive),
        }
        member["upload_id"] = kept.json()["upload_id"]

    def wrong_size(member: dict) -> None:
        member["size"] += 1

    fresh_upload()
    assert "declares" in _error(sent(wrong_size), 422, "invalid_flow_files")["message"]
    error = _error(client.post("/v1/graph-runs", json=body), 422, "invalid_flow_files")
    assert "does not hold" in error["message"]

    # A call refused before its members are read (a body not the shape) spends them too.
    fresh_upload()
    both = {**body, "graph_hash": "sha256:" + "0" * 64}
    _error(client.post("/v1/graph-runs", json=both), 400, "bad_request")
    error = _error(client.post("/v1/graph-runs", json=body), 422, "invalid_flow_files")
    assert "does not hold" in error["message"]

    # So does one its pre-check refuses (a member the flow needs, left out).
    fresh_upload()
    missing = json.loads(json.dumps(body))
    missing["members"] = [m for m in missing["members"] if m["role"] != "agent"]
    _error(client.post("/v1/graph-runs", json=missing), 400, "invalid_graph")
    error = _error(client.post("/v1/graph-runs", json=body), 422, "invalid_flow_files")
    assert "does not hold" in error["message"]
    assert client.get("/v1/runs").json()["runs"] == []


def _digest(files, member: dict) -> str:
    return files.bundle.members[member["key"]].sha256


def _tar(*entries: tarfile.TarInfo, data: bytes = b"bytes") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for entry in entries:
            if entry.isreg():
                entry.size = len(data)
                tar.addfile(entry, io.BytesIO(data))
            else:
                tar.addfile(entry)
    return buffer.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type = kind
    entry.linkname = target
    return entry


def test_an_upload_is_one_regular_file_in_a_gzipped_tar(served) -> None:
    daemon, client, _ = served
    assert _upload(client, _tar(_entry("one.txt"))).status_code == 201
    refused = {
        "a link": _tar(_entry("one.txt", tarfile.SYMTYPE, "/etc/passwd")),
        "a hard link": _tar(_entry("one.txt", tarfile.LNKTYPE, "other.txt")),
        "a directory": _tar(_entry("dir", tarfile.DIRTYPE)),
        "two files": _tar(_entry("one.txt"), _entry("two.txt")),
        "a name with ..": _tar(_entry("../one.txt")),
        "an absolute name": _tar(_entry("/one.txt")),
        "no file": _tar(),
        "not gzip": b"plain text",
        "not a tar": gzip.compress(b"plain text, gzipped"),
    }
    for why, archive in refused.items():
        error = _error(_upload(client, archive), 422, "invalid_flow_files")
        assert error["message"].startswith("the upload is refused"), (why, error)
    _error(_upload(client, _tar(_entry("one.txt")), "text/plain"), 415, "unsupported_media_type")
    over = os.urandom(32 * 1024 * 1024 + 1)
    error = _error(_upload(client, over), 413, "payload_too_large")
    assert "32 MiB" in error["message"]
    # Auth as every /v1 route: no token, no upload.
    with httpx.Client(base_url=daemon.base_url) as anonymous:
        _error(_upload(anonymous, _tar(_entry("one.txt"))), 401, "unauthorized")


def test_the_sweep_deletes_an_upload_no_call_named_within_the_hour(served, store_url: str) -> None:
    _, client, _ = served
    old = _upload(client, _tar(_entry("old.txt")))
    new = _upload(client, _tar(_entry("new.txt")))
    assert old.status_code == new.status_code == 201, (old.text, new.text)
    old_id, new_id = old.json()["upload_id"], new.json()["upload_id"]
    # Its age, set by the test: kept in the year 2000 (the store's clock judges it).
    execute_sql(
        store_url,
        "UPDATE uploads SET created_at = '2000-01-01T00:00:00.000000Z' "
        f"WHERE upload_id = '{old_id}'",
    )
    deadline = time.monotonic() + SETTLE_SECONDS
    with EventStore.open(store_url) as store:
        while store.uploads.held(old_id):  # the daemon's wake pass sweeps every second
            assert time.monotonic() < deadline, "the old upload was never swept"
            time.sleep(0.1)
        assert store.uploads.held(new_id)


def test_a_proxy_413_on_an_upload_stops_the_client_before_the_call(tmp_path: Path, served) -> None:
    daemon, client, provider = served
    files = collect_flow(str(_project(tmp_path, provider.base_url)))
    proxy_port = free_port()
    conf = nginx_config(tmp_path, listen_port=proxy_port, daemon_port=daemon.port)
    site = tmp_path / "site.conf"
    # A proxy that lets less through than an upload may be (the site lets 32 MiB through).
    small = re.sub(r"client_max_body_size \w+;", "client_max_body_size 64k;", site.read_text())
    assert small.count("client_max_body_size 64k;") == 2
    site.write_text(small)
    proxy = subprocess.Popen(
        nginx_command(conf, "-g", "daemon off;"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(proxy_port, proxy)

        async def through_proxy() -> dict:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{proxy_port}", headers=daemon.headers, timeout=60
            ) as via:
                return await call_with_uploads(via, files.bundle, dict(files.contents))

        with pytest.raises(CliError) as refused:
            trio.run(through_proxy)
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    sentence = str(refused.value)
    assert "413" in sentence and "POST /v1/uploads" in sentence, sentence
    assert "32 MiB" in sentence and "client_max_body_size" in sentence, sentence
    assert "\n" not in sentence and f"in front of http://127.0.0.1:{proxy_port} refused" in sentence
    # No call was sent: the daemon has no run.
    assert client.get("/v1/runs").json()["runs"] == []


def _wait_listening(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        assert process.poll() is None, "nginx exited; see nginx-error.log"
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=5)
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline, "nginx never listened"
            time.sleep(0.05)


async def test_upload_answers_match_the_document(server_factory) -> None:
    """Every status the document lists for /v1/uploads, against the served document."""
    server = await server_factory(auth_token=TOKEN)
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call
    gz = {"Content-Type": "application/gzip"}
    archive = _tar(_entry("one.txt"))
    kept = await call(api, "POST", "/v1/uploads", expect=201, content=archive, headers=gz)
    assert kept["content_hash"] == archive_hash(archive) and kept["size"] == len(archive)
    await call(api, "POST", "/v1/uploads", expect=422, content=b"not gzip", headers=gz)
    plain = {"Content-Type": "text/plain"}
    await call(api, "POST", "/v1/uploads", expect=415, content=archive, headers=plain)
    over = b"x" * (32 * 1024 * 1024 + 1)
    await call(api, "POST", "/v1/uploads", expect=413, content=over, headers=gz)
    await call(server.new_client(), "POST", "/v1/uploads", expect=401, content=archive, headers=gz)
    with below_the_free_space_floor(server.state):
        await call(api, "POST", "/v1/uploads", expect=507, content=archive, headers=gz)
    unreached = {seen for seen in contract.unreached() if seen[0] in UPLOAD_PATHS}
    assert not unreached, f"documented but never answered: {sorted(unreached)}"
    assert ("/v1/uploads", "post") in contract.requests


def test_an_upload_outlives_a_sigkilled_daemon_and_serves_the_call_on_the_next(
    tmp_path: Path, served
) -> None:
    daemon, client, provider = served
    files = collect_flow(str(_project(tmp_path, provider.base_url)))
    shutil.rmtree(tmp_path / "proj")
    body = _body_with_uploads(daemon, files)
    assert any("upload_id" in member for member in body["members"])
    # The uploads are in the store, not this process: SIGKILL it and start another over it.
    daemon.kill()
    daemon.start()
    started = client.post("/v1/graph-runs", json={**body, "input": "tide"})
    assert started.status_code == 201, started.text
    status = _settled(client, started.json()["run"])
    assert status == {"state": "completed", "output": {"second": "<<tide>>"}}
