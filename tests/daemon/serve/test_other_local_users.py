"""Other local users can neither drive the daemon nor read its runs (issue 29, item 2), with real
`salvor serve` processes, real files and a real second user.

* A daemon that may start programs refuses TCP without a token, as does one on an address other
  machines reach: one sentence, exit 2, nothing listening.
* ``--listen unix:PATH`` serves the API on a socket only its user can open (0600): curl, the
  command line's hint and the SDK (HTTP and the live WebSocket) speak it; a socket a killed
  daemon left is replaced, one a live daemon holds never is.
* The state directory is 0700 and the store and its side files 0600 while a daemon writes; an
  older store open to others is tightened.
* ``nobody`` (``setpriv``) cannot connect to the socket, cannot read the store, and is refused
  (401) by a TCP daemon with a token.
* A daemon without ``--allow-process-agents`` runs no stored process agent: a recovered run and a
  new one fail saying why, and the program never starts again (SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.chaos.test_kill_serve import Daemon
from tests.daemon.serve.test_one_daemon_per_store import (
    REPO,
    agent_pids,
    refused,
    salvor,
    sleeper_toml,
)
from tests.support.ports import free_port

sys.path.insert(0, str(REPO / "contrib" / "sdk"))

from salvor_client import ClientRun, Salvor

GATED = REPO / "contrib" / "curl" / "refund-with-approval.toml"
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def wait_for(condition, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory of ours that other users may enter (0755; pytest's own are 0700, which would
    hide what is inside from them whatever its modes)."""
    directory = Path(tempfile.mkdtemp(prefix="salvor-others-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("a second local user needs root and setpriv (util-linux)")
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=30, check=False)


def curl(sock: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["curl", "-s", "--unix-socket", str(sock), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# -- refusals at start ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "flags", "fragments"),
    [
        (
            "127.0.0.1",
            ["--allow-process-agents"],
            ["--allow-process-agents", "--auth-token ENV_VAR", "--listen unix:PATH"],
        ),
        (
            "0.0.0.0",
            [],
            ["reachable from other machines", "--auth-token ENV_VAR", "--listen unix:PATH"],
        ),
        (
            "127.0.0.1",
            ["--workspace", "/tmp", "--allow-bash"],
            ["--allow-bash", "shell commands", "--auth-token ENV_VAR", "--listen unix:PATH"],
        ),
        ("127.0.0.1", ["--allow-bash"], ["--allow-bash needs --workspace DIR"]),
    ],
    ids=["process-agents-on-tcp", "non-loopback", "bash-on-tcp", "bash-without-workspace"],
)
def test_serve_refuses_tcp_without_a_token_where_others_could_drive_it(
    tmp_path: Path, listen: str, flags: list[str], fragments: list[str]
) -> None:
    port = free_port()
    result = salvor(
        f"sqlite:///{tmp_path / 'salvor.db'}",
        "serve",
        "--listen",
        f"{listen}:{port}",
        *flags,
    )
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("salvor: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


# -- the Unix socket -----------------------------------------------------------------------------


async def sdk_round_trip(address: str) -> tuple[list[dict], dict]:
    """A client-driven run recorded through the SDK over ``address``, and its first events read
    back on the live WebSocket."""
    async with ClientRun(address) as run:
        await run.start(agent="sha256:" + "0" * 64, input={"over": "the socket"})
        await run.complete({"ok": True})
        run_id = run.run_id
    async with Salvor(address) as client:
        graphs = await client.list_graphs()
        seen = []
        with trio.fail_after(30):
            async with client.live() as live:
                await live.subscribe(run_id)
                async for message in live:
                    if message["type"] == "event":
                        seen.append(message["event"])
                        if message["event"]["event"]["kind"] == "RunCompleted":
                            break
    return seen, {"graphs": graphs, "run": run_id}


def test_a_daemon_on_a_unix_socket_serves_curl_the_cli_hint_and_the_sdk(
    tmp_path: Path, shared_dir: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'salvor.db'}"
    sock = shared_dir / "salvor.sock"
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.listen_on(sock)
    try:
        daemon.start()
        assert stat.S_ISSOCK(os.lstat(sock).st_mode) and mode(sock) == 0o600
        health = curl(sock, "http://localhost/v1/health")
        assert json.loads(health.stdout)["status"] == "ok", health

        # A gated run, started with curl over the socket.
        agent = json.loads(
            curl(
                sock,
                "http://localhost/v1/agents",
                "-H",
                "Content-Type: application/toml",
                "--data-binary",
                f"@{GATED}",
            ).stdout
        )["agent"]
        body = json.dumps({"agent": agent, "input": {"invoice_id": "INV-U1"}})
        started = curl(
            sock, "http://localhost/v1/runs", "-H", "Content-Type: application/json", "-d", body
        )
        run_id = json.loads(started.stdout)["run"]
        with daemon.client(timeout=30) as client:
            wait_for(
                lambda: client.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "suspended",
                "the gate",
            )
            # `salvor resume` beside it is refused, and names the request that works: over the
            # socket. Running that very command resumes the run.
            decision = '{"approved": true, "note": "over the socket"}'
            result = refused(store_url, "resume", run_id, "--input", decision)
            assert result.returncode == 1, result
            hint = re.search(r"`(curl [^`]*)`", result.stderr)
            assert hint and f"--unix-socket {sock} http://localhost/" in hint[1], result.stderr
            ran = subprocess.run(
                ["bash", "-c", hint[1]], capture_output=True, text=True, timeout=30, check=False
            )
            assert ran.returncode == 0 and '"error"' not in ran.stdout, ran
            wait_for(
                lambda: client.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "completed",
                "the resumed run",
            )

            # The SDK: HTTP and the live WebSocket, both over the socket.
            events, answers = trio.run(sdk_round_trip, f"unix:{sock}")
            assert [e["seq"] for e in events] == list(range(len(events))) and events
            assert answers["graphs"] == []
            client_run = client.get(f"/v1/runs/{answers['run']}").json()
            assert client_run["status"]["state"] == "completed"

        # A second daemon on the same socket is refused; the first still answers.
        second = salvor(f"sqlite:///{tmp_path / 'other.db'}", "serve", "--listen", f"unix:{sock}")
        assert second.returncode == 1, second
        assert f"another salvor serve listens on the Unix socket {sock}" in second.stderr
        assert json.loads(curl(sock, "http://localhost/v1/health").stdout)["status"] == "ok"

        # Killed, it leaves its socket; the next start replaces it. A clean stop removes it.
        daemon.kill()
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)
        daemon.start()
        assert json.loads(curl(sock, "http://localhost/v1/health").stdout)["status"] == "ok"
        assert daemon.terminate()[0] == 0
        assert not sock.exists()
    finally:
        if daemon.proc is not None and daemon.alive():
            daemon.kill()


def test_a_socket_in_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone could swap the socket for their own
    result = salvor(
        f"sqlite:///{tmp_path / 'salvor.db'}", "serve", "--listen", f"unix:{shared / 's.sock'}"
    )
    assert result.returncode == 1, result
    assert "writable by other users" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (shared / "s.sock").exists()


# -- the state directory and the store's files ---------------------------------------------------


def test_the_state_directory_is_0700_and_the_store_files_0600_while_a_daemon_writes(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    daemon = Daemon(tmp_path, "unused", tmp_path / "effects.jsonl")
    at = daemon.args.index("--store")
    del daemon.args[at : at + 2]  # the default store, in the state directory
    daemon.env = {
        k: v
        for k, v in daemon.env.items()
        if k not in ("XDG_STATE_HOME", "STATE_DIRECTORY", "HOME")
    }
    daemon.env["HOME"] = str(home)
    state = home / ".local" / "state" / "salvor"
    store = state / "salvor.db"
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            agent = client.post(
                "/v1/agents",
                content=(REPO / "contrib" / "agents" / "refund-desk.toml").read_bytes(),
                headers={"Content-Type": "application/toml"},
            ).json()["agent"]
            run_id = client.post(
                "/v1/runs", json={"agent": agent, "input": {"invoice_id": "INV-M1"}}
            ).json()["run"]
            wait_for(
                lambda: client.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "completed",
                "the run",
            )
        # While the daemon holds the store open: SQLite's side files exist now.
        assert mode(state) == 0o700
        files = [store, *(store.with_name(store.name + s) for s in ("-wal", "-shm", ".lock"))]
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        assert daemon.terminate()[0] == 0

        # A store an older salvor left open to others is tightened at the next start.
        state.chmod(0o755)
        store.chmod(0o644)
        daemon.start()
        assert mode(state) == 0o700 and mode(store) == 0o600
        assert "was open to other users" in daemon.log()
        assert daemon.terminate()[0] == 0
    finally:
        if daemon.proc is not None and daemon.alive():
            daemon.kill()


# -- a second, unprivileged local user -----------------------------------------------------------


def test_another_local_user_can_neither_connect_nor_read_the_store_nor_pass_without_the_token(
    tmp_path: Path, shared_dir: Path
) -> None:
    as_nobody("true")  # skips here when there is no second user to be
    # The store in a directory others may enter (the operator's choice; salvor leaves it as it
    # is): the file's own mode is what keeps them out.
    store_dir = shared_dir / "store"
    store_dir.mkdir(mode=0o755)
    store_dir.chmod(0o755)
    sock = shared_dir / "salvor.sock"
    daemon = Daemon(tmp_path, f"sqlite:///{store_dir / 'salvor.db'}", tmp_path / "effects.jsonl")
    daemon.listen_on(sock)
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            assert client.get("/v1/health").status_code == 200
        # nobody sees both files (the directories let them in) and can use neither.
        listed = as_nobody("ls", str(shared_dir), str(store_dir))
        assert "salvor.sock" in listed.stdout and "salvor.db" in listed.stdout, listed
        denied = as_nobody("curl", "-s", "--unix-socket", str(sock), "http://localhost/v1/runs")
        assert denied.returncode == 7 and '"runs"' not in denied.stdout, denied
        read = as_nobody("cat", str(store_dir / "salvor.db"))
        assert read.returncode != 0 and "Permission denied" in read.stderr, read
        # The refusal is the socket's mode: opened up, the same user gets in.
        sock.chmod(0o666)
        opened = as_nobody("curl", "-s", "--unix-socket", str(sock), "http://localhost/v1/runs")
        assert '"runs"' in opened.stdout, opened
        sock.chmod(0o600)
        assert daemon.terminate()[0] == 0
    finally:
        if daemon.proc is not None and daemon.alive():
            daemon.kill()

    # On TCP with a token, nobody without it is refused.
    tcp = Daemon(tmp_path, f"sqlite:///{tmp_path / 'tcp.db'}", tmp_path / "effects.jsonl")
    tcp.allow_process_agents()
    try:
        tcp.start()
        answer = as_nobody(
            "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{tcp.base_url}/v1/runs"
        )
        assert answer.stdout == "401", answer
        with tcp.client(timeout=30) as client:
            assert client.get("/v1/runs").status_code == 200
    finally:
        if tcp.proc is not None and tcp.alive():
            tcp.kill()


# -- stored process agents -----------------------------------------------------------------------


def test_a_daemon_without_the_flag_runs_no_stored_process_agent(
    tmp_path: Path, store_url: str
) -> None:
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.allow_process_agents()
    allowed_args = list(daemon.args)
    try:
        # Stored and started by a daemon that may run it; killed mid-run, the run is
        # interrupted.
        daemon.start()
        with daemon.client(timeout=30) as client:
            agent = client.post(
                "/v1/agents",
                content=sleeper_toml(tmp_path),
                headers={"Content-Type": "application/toml"},
            ).json()["agent"]
            interrupted = client.post("/v1/runs", json={"agent": agent, "input": "x"}).json()["run"]
        agent_pids(tmp_path)
        daemon.kill()

        # The same store, a daemon without the flag: the recovered run fails saying why.
        daemon.args = [a for a in allowed_args if a not in ("--allow-process-agents",)]
        daemon.start()
        with daemon.client(timeout=30) as client:

            def failed(run_id: str) -> dict | None:
                status = client.get(f"/v1/runs/{run_id}").json()["status"]
                return status if status["state"] == "failed" else None

            for run_id in (
                interrupted,
                client.post("/v1/runs", json={"agent": agent, "input": "y"}).json()["run"],
            ):
                status = wait_for(lambda run_id=run_id: failed(run_id), f"run {run_id} to fail")
                assert status["error"].startswith("this daemon runs no process agent"), status
                assert "--allow-process-agents" in status["error"], status
        assert len(agent_pids(tmp_path)) == 1, "the daemon without the flag started the program"
        assert daemon.terminate()[0] == 0
    finally:
        (tmp_path / "release").touch()
        if daemon.proc is not None and daemon.alive():
            daemon.kill()
