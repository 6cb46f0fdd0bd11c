"""Stop a `salvor serve` process (SIGSTOP) the way a pause test means: past its lease, never
inside a write of an SQLite store.

A process stopped while it holds an SQLite store's write turn holds every writer of the file up
until it continues (``store/_write_turns.py``): no peer can take its runs over, since a takeover
is a write. Nothing outside the stopped process can end that, so a test that waits for a peer to
take a stopped node's runs would wait for the node instead. ``stop_outside_writes`` continues
such a process for a moment and stops it again until it holds no turn. (On PostgreSQL the server
ends a stopped process's open transaction itself, ``store/_engine.py``: nothing to avoid there.)
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from salvor.store import sqlite_path
from salvor.store._file_modes import TURN_SUFFIX

# How often a stop is made again before giving up (a node at rest writes a few times a second).
TRIES = 500


def stop_outside_writes(pid: int, store_url: str) -> None:
    """SIGSTOP ``pid``, at an instant it holds no write turn of the store at ``store_url``.

    Raises:
        AssertionError: it held a turn at every one of ``TRIES`` stops (it is left stopped).
    """
    os.kill(pid, signal.SIGSTOP)
    turn = _turn_of(store_url)
    if turn is None:
        return
    for _ in range(TRIES):
        if not holds_flock(pid, turn):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)
        os.kill(pid, signal.SIGSTOP)
    raise AssertionError(f"process {pid} held the write turn {turn} at each of {TRIES} stops")


def holds_flock(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds a ``flock`` on ``path`` (``/proc/locks``; a waiter's
    ``->`` line is no hold). False when ``path`` does not exist."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return False
    where = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4:6] == [str(pid), where]:
            return True
    return False


def _turn_of(store_url: str) -> Path | None:
    """The write turn file of an SQLite store (None for PostgreSQL)."""
    path = sqlite_path(store_url)
    if path is None:
        return None
    return Path(os.path.realpath(path) + TURN_SUFFIX)
