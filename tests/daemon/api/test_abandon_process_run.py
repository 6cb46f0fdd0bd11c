"""Abandoning a process run ends its process: the group it leads, children included, is killed
and waited for, nothing is recorded after ``RunAbandoned``, and a late call from a process the
kill did not reach is refused in its wire's error shape, never answered with a 500."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys

import trio
from salvor.protocol import EventKind, RunAbandoned

from tests.support.backends import SQLITE_ONLY
from tests.support.cli import salvor_in_process
from tests.support.processes import gone
from tests.support.scripted_provider import text_reply

# SQLite alone (tests/support/backends.py): what it tests is a drive's end, above the store.
STORE_BACKENDS = SQLITE_ONLY

# A process agent that asks its model once, starts a child of its own in its process group
# (``sleep 300``) and, in mode "escape", a helper in a session of its own (out of the group's
# reach, as a program that daemonizes would be), writes their pids, and waits for GO. Then, in mode
# "group", it asks its model again itself; in mode "escape" the helper asks the model and the
# ``salvor`` MCP stand-in while the agent keeps waiting. LATE gets what the late calls heard.
AGENT = r"""
import json, os, subprocess, sys, time, urllib.error, urllib.request
from pathlib import Path


def post(url, body):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return {"status": answer.status, "body": json.loads(answer.read() or b"null")}
    except urllib.error.HTTPError as refused:
        return {"status": refused.code, "body": json.loads(refused.read() or b"null")}


def ask(text):
    body = {"model": "scripted-model", "messages": [{"role": "user", "content": text}]}
    return post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body)


def write(name, value):
    path = Path(os.environ[name])
    path.with_suffix(".tmp").write_text(json.dumps(value))
    path.with_suffix(".tmp").rename(path)


def wait_for_go():
    go, deadline = Path(os.environ["GO"]), time.monotonic() + 300
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


mode = sys.argv[1]
if mode == "helper":
    wait_for_go()
    model = ask("and then?")
    mcp = post(os.environ["SALVOR_MCP_URL_SALVOR"], {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    write("LATE", {"model": model, "mcp": mcp})
    sys.exit(0)
ask(os.environ["SALVOR_PROMPT"])
pids = [os.getpid(), subprocess.Popen(["sleep", "300"]).pid]
if mode == "escape":
    helper = subprocess.Popen([sys.executable, sys.argv[0], "helper"], start_new_session=True)
    pids.append(helper.pid)
write("PIDS", pids)
wait_for_go()
if mode == "group":
    write("LATE", {"model": ask("and then?")})
else:
    time.sleep(300)
"""


def definition(tmp_path, mode: str) -> str:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {name: str(tmp_path / name.lower()) for name in ("PIDS", "GO", "LATE")}
    command = json.dumps([sys.executable, str(script), mode])
    return (
        f'name = "sleeper"\nkind = "process"\ncommand = {command}\ntimeout = 600\n[env]\n'
        + "".join(f"{name} = {json.dumps(value)}\n" for name, value in env.items())
    )


async def started_agent(
    server, providers, monkeypatch, tmp_path, mode: str = "group"
) -> tuple[str, list[int]]:
    """A run of the sleeping agent, once its first call is answered and its child started."""
    provider = providers([text_reply("first"), text_reply("second")])
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    agent = await server.register_agent(definition(tmp_path, mode))
    run_id = await server.start_run(agent, "wait for me")
    with trio.fail_after(60):
        while not (tmp_path / "pids").exists():
            await trio.sleep(0.02)
    return run_id, json.loads((tmp_path / "pids").read_text())


async def test_abandon_kills_the_process_group_of_a_driven_process_run(
    server_factory, providers, monkeypatch, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    server = await server_factory(allow_process_agents=True)
    run_id, pids = await started_agent(server, providers, monkeypatch, tmp_path)
    assert not any(gone(pid) for pid in pids)

    response = await server.client.post(f"/v1/runs/{run_id}/abandon", json={"reason": "enough"})
    assert response.status_code == 200, response.text
    (tmp_path / "go").write_text("go")  # a process still there now makes its late call

    with trio.fail_after(30):  # a bound for a process that never goes, not a guess at the time
        while not all(gone(pid) for pid in pids):
            await trio.sleep(0.02)
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "abandoned", body
    assert body["status"]["reason"] == "enough"
    access = server.state.runtime.access
    log = await access.read(access.store.read_log, run_id)
    assert log[-1].event.KIND is EventKind.RUN_ABANDONED, log[-3:]
    assert not (tmp_path / "late").exists()
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text


async def wait_gone(pids: list[int]) -> None:
    with trio.fail_after(30):  # a bound for a process that never goes, not a guess at the time
        while not all(gone(pid) for pid in pids):
            await trio.sleep(0.02)


async def late_calls(tmp_path) -> dict:
    """Let the helper make its late calls; what they heard."""
    (tmp_path / "go").write_text("go")
    with trio.fail_after(60):
        while not (tmp_path / "late").exists():
            await trio.sleep(0.02)
    return json.loads((tmp_path / "late").read_text())


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


async def test_a_process_that_left_the_group_is_refused_in_its_wires_shape_after_the_abandon(
    server_factory, providers, monkeypatch, tmp_path, caplog
):
    server = await server_factory(allow_process_agents=True)
    run_id, (agent, child, helper) = await started_agent(
        server, providers, monkeypatch, tmp_path, "escape"
    )
    try:
        response = await server.client.post(f"/v1/runs/{run_id}/abandon", json={})
        assert response.status_code == 200, response.text
        await wait_gone([agent, child])
        assert not gone(helper)  # out of the group's reach, as a daemonized program is
        late = await late_calls(tmp_path)
    finally:
        kill(helper)
    # Its drive has ended: the capability names no run any more, and each lane says so its way.
    assert late["model"]["status"] == 404, late
    assert "the drive it was issued to has ended" in late["model"]["body"]["error"]["message"]
    assert late["mcp"]["status"] == 404, late
    assert late["mcp"]["body"]["jsonrpc"] == "2.0" and "error" in late["mcp"]["body"], late
    access = server.state.runtime.access
    log = await access.read(access.store.read_log, run_id)
    assert log[-1].event.KIND is EventKind.RUN_ABANDONED
    assert not [r for r in caplog.records if r.exc_info], caplog.text


async def test_a_run_ended_by_another_writer_refuses_its_process_and_ends_the_drive(
    server_factory, providers, monkeypatch, tmp_path, caplog
):
    """Another writer of the store (a ``salvor`` process beside the daemon) abandons the run
    under the daemon's drive: the next call of its process meets the run's end, is refused with
    a 410 in its wire's shape (not a 500), and the drive ends, its process group with it."""
    server = await server_factory(allow_process_agents=True)
    run_id, (agent, child, helper) = await started_agent(
        server, providers, monkeypatch, tmp_path, "escape"
    )
    access = server.state.runtime.access
    try:
        # The first call's answer is recorded once the agent has it: wait until it is.
        with trio.fail_after(30):
            while (view := await access.read(access.store.read_view, run_id)).pending:
                await trio.sleep(0.02)
        await access.append(run_id, [RunAbandoned(reason="from the shell")], view)
        late = await late_calls(tmp_path)
        await wait_gone([agent, child])
    finally:
        kill(helper)
    # Refused by the proxy (410), or, once the daemon's heartbeat saw the run ended and stopped
    # its drive first, by a path no longer mounted (404): never a 500.
    assert late["model"]["status"] in (410, 404), late
    assert ("takes no more calls" if late["model"]["status"] == 410 else "no run is mounted") in (
        late["model"]["body"]["error"]["message"]
    ), late
    assert late["mcp"]["status"] in (200, 404), late  # refused by the lane, or once unmounted
    assert "error" in late["mcp"]["body"], late
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "abandoned", body
    log = await access.read(access.store.read_log, run_id)
    assert log[-1].event.KIND is EventKind.RUN_ABANDONED
    assert not [r for r in caplog.records if r.exc_info], caplog.text


async def test_salvor_abandon_beside_the_daemon_ends_the_process_it_drives(
    server_factory, providers, monkeypatch, tmp_path, caplog, store_url
):
    """``salvor abandon`` works beside a daemon (it takes no lock); the daemon's drive of the run
    reads that the run ended and stops, its process group with it, though the process never
    calls again."""
    server = await server_factory(allow_process_agents=True)
    run_id, pids = await started_agent(server, providers, monkeypatch, tmp_path)
    access = server.state.runtime.access
    with trio.fail_after(30):  # the first call's answer is recorded once the agent has it
        while (await access.read(access.store.read_view, run_id)).pending:
            await trio.sleep(0.02)
    done = await trio.to_thread.run_sync(
        lambda: salvor_in_process("abandon", "--store", store_url, run_id, "--reason", "shell")
    )
    assert done.returncode == 0, done.stderr
    await wait_gone(pids)  # GO is never written: the agent would have waited 300 s
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "abandoned", body
    assert body["status"]["reason"] == "shell"
    log = await access.read(access.store.read_log, run_id)
    assert log[-1].event.KIND is EventKind.RUN_ABANDONED
    assert not [r for r in caplog.records if r.exc_info], caplog.text
