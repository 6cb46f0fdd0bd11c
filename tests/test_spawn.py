"""The fork server and its clients (tests/support/zygote.py, forked_child.py, spawn.py).

Every test runs twice: with the child forked from the server, and exec'd
(``SALVOR_TEST_SPAWN=exec``), and asks the same of both: the forked child must answer as a fresh
``python -m salvor.daemon.cli`` does. A run whose model call never answers (a listener that
never accepts) is a salvor process that sits still until a signal ends it.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import trio

from tests.support import spawn
from tests.support.runtime import agent_toml
from tests.support.spawn import ONE_PROCESS, open_salvor_process, run_salvor, salvor_process

TIMEOUT = 60


@pytest.fixture(params=["fork", "exec"])
def mode(request, monkeypatch) -> str:
    if request.param == "exec":
        monkeypatch.setenv(spawn.SPAWN_ENV, "exec")
    else:
        monkeypatch.delenv(spawn.SPAWN_ENV, raising=False)
    return request.param


def started_as(mode: str, process) -> None:
    """The process was started the way the mode says (no silent fallback to exec)."""
    forked = isinstance(process, spawn.ForkedPopen | spawn.ForkedTrioProcess)
    assert forked == (mode == "fork"), type(process)


class StuckModel:
    """A model endpoint that takes each call and never answers it."""

    def __init__(self, tmp_path: Path) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.calls: list[socket.socket] = []
        self.agent = tmp_path / "agent.toml"
        self.agent.write_text(agent_toml(f"http://127.0.0.1:{self.listener.getsockname()[1]}"))
        self.store = tmp_path / "salvor.db"

    def run_args(self) -> list[str]:
        return ["run", str(self.agent), "--input", '"go"', "--store", str(self.store)]

    def wait_for_call(self) -> None:
        """Block until a run is inside its model call."""
        ready, _, _ = select.select([self.listener], [], [], TIMEOUT)
        assert ready, "no run called the model"
        self.calls.append(self.listener.accept()[0])

    def close(self) -> None:
        for connection in [*self.calls, self.listener]:
            connection.close()


@pytest.fixture
def stuck(tmp_path) -> Iterator[StuckModel]:
    model = StuckModel(tmp_path)
    yield model
    model.close()


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["serve", "--help"], ["bogus"]])
def test_the_answer_is_an_exec_d_salvor_s(mode, args):
    command = [sys.executable, "-m", "salvor.daemon.cli", *args]
    exec_d = subprocess.run(command, capture_output=True, text=True, check=False)
    result = run_salvor(args, capture_output=True, text=True, timeout=TIMEOUT)
    assert (result.returncode, result.stdout, result.stderr) == (
        exec_d.returncode,
        exec_d.stdout,
        exec_d.stderr,
    )
    assert result.args == exec_d.args


def test_the_environment_and_working_directory_are_the_child_s(mode, tmp_path, monkeypatch):
    monkeypatch.setenv("SALVOR_STORE", "/the/test/s/own.db")  # not the child's: env= replaces
    home = tmp_path / "home"
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    result = run_salvor(["runs"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert f"no store at {home}/.local/state/salvor/salvor.db;" in result.stderr
    relative = run_salvor(
        ["runs"], env={**env, "SALVOR_STORE": "rel.db"}, cwd=tmp_path, capture_output=True
    )
    assert f"no store at {tmp_path}/rel.db;".encode() in relative.stderr
    monkeypatch.setenv("SALVOR_STORE", str(tmp_path / "inherited.db"))
    inherited = run_salvor(["runs"], capture_output=True, text=True)
    assert f"no store at {tmp_path}/inherited.db;" in inherited.stderr


def test_pipes_and_exit_statuses(mode, tmp_path):
    with salvor_process(
        ["runs", "--store", str(tmp_path / "none.db")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        started_as(mode, process)
        out, err = process.communicate(timeout=TIMEOUT)
    assert (process.returncode, out) == (1, "")
    assert err.startswith("salvor: no store at ")
    merged = run_salvor(["bogus"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert merged.returncode == 2 and b"invalid choice: 'bogus'" in merged.stdout
    assert run_salvor(["--version"], stdout=subprocess.DEVNULL).returncode == 0
    with pytest.raises(subprocess.CalledProcessError):
        run_salvor(["bogus"], stderr=subprocess.DEVNULL, check=True)


def test_an_uncaught_exception_exits_1_with_its_traceback(mode, tmp_path):
    env = {**os.environ, "SALVOR_FAULT_KILL_AFTER_SEQ": "not a number"}
    # One process: under a supervisor the worker's traceback would be followed by the crash loop's.
    args = ["serve", "--store", str(tmp_path / "s.db"), "--listen", "127.0.0.1:0", *ONE_PROCESS]
    result = run_salvor(args, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):"), result.stderr
    assert result.stderr.rstrip().endswith("must be a whole number, not 'not a number'")


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGKILL, -9), (signal.SIGTERM, -15), (signal.SIGINT, 1)]
)
def test_a_signal_ends_the_child_as_it_ends_an_exec_d_one(mode, stuck, sig, code):
    with spawn.sigint_as_a_terminal_gives_it():  # pytest may run as a background job
        process = salvor_process(
            stuck.run_args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    started_as(mode, process)
    stuck.wait_for_call()
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    process.send_signal(sig)
    assert process.wait(timeout=TIMEOUT) == code
    if sig == signal.SIGINT:  # KeyboardInterrupt, as a fresh interpreter raises it
        assert b"salvor: interrupted;" in process.stderr.read()
    process.stderr.close()


def test_a_run_past_its_timeout_is_killed_and_raises(mode, stuck):
    # Long enough for the command to start and reach its model call on a loaded machine (5 s
    # was not, once, under a load of 12 on two cores): what is tested is the kill past it.
    with pytest.raises(subprocess.TimeoutExpired):
        run_salvor(stuck.run_args(), capture_output=True, timeout=15)
    stuck.wait_for_call()  # it had got as far as its model call
    call = stuck.calls[0]
    call.settimeout(TIMEOUT)
    while call.recv(65536):  # the request, then EOF: the child's end closed when it was killed
        pass


def test_proc_reads_the_child_s_command_line_and_environment(mode, stuck):
    # The store names a lock's holder from its command line; the orphan sweep reads environments.
    env = {**os.environ, "SPAWN_TEST_MARK": "the child's"}
    process = salvor_process(stuck.run_args(), env=env)
    try:
        stuck.wait_for_call()
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
        assert [arg.decode() for arg in cmdline if arg] == process.args
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        assert b"SPAWN_TEST_MARK=the child's" in environ
        assert not any(entry.startswith(b"ZYGOTE_ROOM=") for entry in environ)
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("new_session", [False, True])
def test_a_new_session_leads_its_own_group(mode, stuck, new_session):
    process = salvor_process(stuck.run_args(), start_new_session=new_session)
    try:
        stuck.wait_for_call()
        expected = process.pid if new_session else os.getpgrp()
        assert os.getpgid(process.pid) == expected
        assert os.getsid(process.pid) == (process.pid if new_session else os.getsid(0))
    finally:
        process.kill()
        process.wait()


def test_only_the_fds_asked_for_reach_the_child(mode, stuck, tmp_path):
    (tmp_path / "kept").write_text("")
    (tmp_path / "closed").write_text("")
    kept = os.open(tmp_path / "kept", os.O_RDONLY)
    closed = os.open(tmp_path / "closed", os.O_RDONLY)
    os.set_inheritable(closed, True)  # even so: Popen closes what is not passed
    read, write = os.pipe()
    try:
        process = salvor_process(stuck.run_args(), stdin=read, pass_fds=[kept])
        stuck.wait_for_call()
        fds = Path(f"/proc/{process.pid}/fd")
        targets = {int(fd.name): os.readlink(fd) for fd in fds.iterdir()}
        pipe = f"pipe:[{os.fstat(read).st_ino}]"
        assert targets[kept] == str(tmp_path / "kept")
        assert targets[0] == pipe
        assert str(tmp_path / "closed") not in targets.values()
        # Each at its number alone: no copy left of what carried it there (the fork server's).
        links = list(targets.values())
        assert (links.count(pipe), links.count(str(tmp_path / "kept"))) == (1, 1), targets
        process.kill()
        assert process.wait(timeout=TIMEOUT) == -9
    finally:
        for fd in (kept, closed, read, write):
            os.close(fd)


def test_two_children_at_once(mode, stuck):
    first = salvor_process(stuck.run_args()[:-1] + [stuck.run_args()[-1] + "-1"])
    second = salvor_process(stuck.run_args()[:-1] + [stuck.run_args()[-1] + "-2"])
    stuck.wait_for_call()
    stuck.wait_for_call()
    assert first.pid != second.pid
    second.terminate()
    assert second.wait(timeout=TIMEOUT) == -15
    assert first.poll() is None
    first.kill()
    assert first.wait(timeout=TIMEOUT) == -9


async def test_the_trio_wait_lets_other_tasks_run(mode, stuck):
    process = await open_salvor_process(stuck.run_args())
    started_as(mode, process)
    await trio.to_thread.run_sync(stuck.wait_for_call)
    ticks = 0
    async with trio.open_nursery() as nursery:

        async def wait() -> None:
            assert await process.wait() == -9
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait)
        while ticks < 5:
            await trio.sleep(0.01)  # the waiting task must leave the thread to this one
            ticks += 1
        assert process.returncode is None
        process.kill()
    assert process.returncode == -9


async def test_the_trio_pipes_are_streams(mode):
    process = await open_salvor_process(["--version"], stdout=subprocess.PIPE)
    started_as(mode, process)
    output = b""
    while chunk := await process.stdout.receive_some():
        output += chunk
    assert await process.wait() == 0
    assert output == f"salvor {version('salvor')}\n".encode()


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"  # exited, not yet reaped by its new parent


@pytest.fixture
def forking(monkeypatch) -> None:
    """The fork server's own tests fork, even in a run that asks for exec."""
    monkeypatch.delenv(spawn.SPAWN_ENV, raising=False)


def test_a_server_that_dies_takes_its_children_and_their_clients_hear(forking, stuck):
    process = salvor_process(stuck.run_args())
    started_as("fork", process)
    stuck.wait_for_call()
    spawn._server().process.kill()
    assert process.wait(timeout=TIMEOUT) == -9
    assert _dead(process.pid)
    assert run_salvor(["--version"], stdout=subprocess.DEVNULL).returncode == 0  # a new server


def test_a_client_that_leaves_early_leaves_the_server_serving(forking, stuck):
    server = spawn._server()
    request = {
        "argv": stuck.run_args(),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "new_session": False,
        "fds": [0, 1, 2],
        "ignored": [],
    }
    connection, pid = server.fork(request, [0, 1, 2])
    connection.close()
    stuck.wait_for_call()
    os.kill(pid, signal.SIGKILL)
    assert run_salvor(["--version"], stdout=subprocess.DEVNULL).returncode == 0
    assert spawn._server() is server
