"""Turns at a SQLite store's write lock (``store/_write_turns.py``): every write transaction of a
salvor process waits for its turn on the kernel lock beside the database, which the kernel lets
go when its holder dies.

The holder is a real process (``python -c``) over the same file; that a writer waits is read
from ``/proc/locks``, where the kernel lists a blocked ``flock`` as a waiter (``->``) with its
pid, so no test depends on how fast the machine is.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from salvor.protocol import EMPTY_VIEW, RunStarted
from salvor.store import EventStore, SeqConflict
from salvor.store._write_turns import WriteTurns

WAIT = 30.0

# Takes the turn at the turn file argv[1] and holds it until killed (``HELD`` once it does).
HOLDER = """
import sys, time
from pathlib import Path
from salvor.store._write_turns import WriteTurns
with WriteTurns(Path(sys.argv[1])).taken():
    print("HELD", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'turns.db'}"


@pytest.fixture
def store(store_url: str) -> Iterator[EventStore]:
    with EventStore.open(store_url) as opened:
        yield opened


def turn_file(store_url: str) -> Path:
    return Path(os.path.realpath(store_url.removeprefix("sqlite:///")) + ".write-turn")


@pytest.fixture
def holder(store_url: str, store: EventStore) -> Iterator[subprocess.Popen]:
    """Another process holding the store's turn until the test ends (or kills it)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(turn_file(store_url))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "HELD"
        yield process
    finally:
        process.kill()
        process.wait()


def waiting_for_turn(path: Path, pid: int) -> bool:
    """Whether ``/proc/locks`` lists ``pid`` blocked on an ``flock`` of ``path``."""
    inode = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" not in fields or "FLOCK" not in fields:
            continue
        rest = fields[fields.index("FLOCK") :]
        if int(rest[3]) == pid and int(rest[4].rsplit(":", 1)[1]) == inode:
            return True
    return False


def turn_is_free(path: Path) -> bool:
    """Whether another open file could take the turn now (tried without waiting)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def in_thread(write: Callable[[], object]) -> tuple[threading.Thread, list]:
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(write()), daemon=True)
    thread.start()
    return thread, outcome


def wait_until_waiting(path: Path, thread: threading.Thread) -> None:
    deadline = time.monotonic() + WAIT
    while not waiting_for_turn(path, os.getpid()):
        assert thread.is_alive(), "the write finished without waiting for the turn"
        assert time.monotonic() < deadline, "the write never waited for the turn"
        time.sleep(0.01)


def started() -> RunStarted:
    return RunStarted(agent_def_hash="sha256:agent", input={"task": "turns"})


@pytest.mark.parametrize("write", ["append", "register a node"])
def test_a_write_waits_for_the_turn_of_a_process_until_that_process_is_killed(
    store_url: str, store: EventStore, holder: subprocess.Popen, write: str
) -> None:
    if write == "append":
        thread, outcome = in_thread(lambda: store.append("run-1", [started()], EMPTY_VIEW))
    else:
        thread, outcome = in_thread(
            lambda: store.owners.register(
                "node-1", name="n", host="h", boot_id="b", pid=1, pid_start="1", lease_seconds=30
            )
        )
    wait_until_waiting(turn_file(store_url), thread)
    # Waiting for its turn, it has not begun: nothing of it is in the store.
    assert store.read_log("run-1") == [] and store.owners.nodes() == []

    holder.send_signal(signal.SIGKILL)
    holder.wait()
    thread.join(WAIT)
    assert not thread.is_alive() and outcome
    if write == "append":
        assert [e.seq for e in store.read_log("run-1")] == [0]
    else:
        assert [node.node_id for node in store.owners.nodes()] == ["node-1"]


def test_the_turn_is_let_go_after_a_commit_and_after_a_rollback(
    store_url: str, store: EventStore
) -> None:
    store.append("run-1", [started()], EMPTY_VIEW)
    path = turn_file(store_url)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert turn_is_free(path)
    with pytest.raises(SeqConflict):
        store.append("run-1", [started()], EMPTY_VIEW)
    assert turn_is_free(path)
    store.append("run-2", [started()], EMPTY_VIEW)
    assert turn_is_free(path)


def test_threads_of_one_process_take_turns_and_a_nested_write_passes(store_url: str) -> None:
    turns = WriteTurns(turn_file(store_url))
    with turns.taken():
        with turns.taken():  # the same thread again: no wait on itself
            pass
        assert not turn_is_free(turns.path)

        def take() -> str:
            with turns.taken():
                return "taken"

        thread, outcome = in_thread(take)
        wait_until_waiting(turns.path, thread)
    thread.join(WAIT)
    assert outcome == ["taken"] and turn_is_free(turns.path)


def test_a_store_that_cannot_take_turns_writes_without_them(tmp_path: Path) -> None:
    turns = WriteTurns(tmp_path / "no such directory" / "db.write-turn")
    ran = []
    with turns.taken():
        ran.append(True)
    assert ran == [True]
