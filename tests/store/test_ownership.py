"""The store locks (``open_locks``): released the moment their holder closes them; daemons share
a store, and a command-line driver and a daemon refuse each other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from salvor.store import EventStore, StoreOwned, normalize_store_url, open_locks


def test_a_closed_serve_lock_is_free_at_once_to_the_next_taker(store_url: str) -> None:
    # A daemon stopped and started again in one process (or a `salvor resume` right after a
    # `salvor serve` exits): the next claim must not find the lock of the one just closed. On
    # PostgreSQL a session lock left to the connection's end is released only when the
    # server has noticed the connection closed, a moment later; and a holder with this very
    # pid is no dead process to wait out.
    url = normalize_store_url(store_url)
    EventStore.open(url).close()
    for _ in range(20):
        first = open_locks(url, "serve")
        first.claim("serve", "")
        first.close()
        second = open_locks(url, "serve")
        try:
            second.claim("serve", "")
        finally:
            second.close()


def test_serving_names_the_daemon_holding_the_store_and_takes_nothing(store_url: str) -> None:
    # What a command line that holds no store lock asks, to say what works beside a daemon.
    url = normalize_store_url(store_url)
    EventStore.open(url).close()
    asking = open_locks(url, "run")
    try:
        assert asking.serving() is None
        daemon = open_locks(url, "serve")
        try:
            daemon.claim("serve", "")
            daemon.announce("http://127.0.0.1:8420")
            serving = asking.serving()
            assert serving is not None and serving.command == "serve"
            assert serving.listen == "http://127.0.0.1:8420"
        finally:
            daemon.close()
        assert asking.serving() is None
        # Asking took no lock: a daemon can claim the store while the asker is still open.
        again = open_locks(url, "serve")
        try:
            again.claim("serve", "")
        finally:
            again.close()
    finally:
        asking.close()


# A command-line driver in a process of its own (record locks are a process's: one process is
# never both a daemon and a command-line driver of one store). It claims, says so, and holds the
# lock until its stdin closes.
DRIVER = """
import sys
from salvor.store import open_locks
locks = open_locks(sys.argv[1], "resume")
locks.claim("", "")
print("held", flush=True)
sys.stdin.read()
"""


def test_several_daemons_share_a_store_and_a_command_line_driver_is_refused_beside_them(
    store_url: str,
) -> None:
    url = normalize_store_url(store_url)
    EventStore.open(url).close()
    first, second = open_locks(url, "serve"), open_locks(url, "serve")
    resume = open_locks(url, "resume")
    try:
        first.claim("serve", "")
        first.announce("http://127.0.0.1:8420")
        second.claim("serve", "")
        with pytest.raises(StoreOwned) as refused:
            resume.claim("", "ask the daemon")
        message = refused.value.message
        assert f"salvor serve (pid {os.getpid()}" in message and "is serving this store" in message
        assert "ask the daemon" in message
        first.close()
        # One daemon still serves.
        with pytest.raises(StoreOwned):
            resume.claim("", "")
        second.close()
        resume.claim("", "")  # none serves now
    finally:
        for locks in (first, second, resume):
            locks.close()


def test_a_daemon_is_refused_while_a_command_line_drives_and_starts_once_it_ended(
    store_url: str,
) -> None:
    url = normalize_store_url(store_url)
    EventStore.open(url).close()
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    daemon = open_locks(url, "serve")
    try:
        assert driver.stdout.readline().strip() == "held"
        with pytest.raises(StoreOwned) as refused:
            daemon.claim("serve", "")
        message = refused.value.message
        assert f"pid {driver.pid}" in message and "is driving runs in this store" in message
        # Refused, it holds nothing: another command line still drives beside the first.
        beside = open_locks(url, "wake")
        try:
            beside.claim("", "")
        finally:
            beside.close()
        driver.stdin.close()
        driver.wait(timeout=30)
        daemon.claim("serve", "")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        daemon.close()


# A daemon's claim of the store, over and over, in a process of its own (record locks are a
# process's): it prints how many claims were refused.
STARTING = """
import sys
from salvor.store import StoreOwned, open_locks
refused = 0
for _ in range(int(sys.argv[2])):
    locks = open_locks(sys.argv[1], "serve")
    try:
        locks.claim("serve", "")
    except StoreOwned:
        refused += 1
    finally:
        locks.close()
print(refused, flush=True)
"""


def test_daemons_starting_at_the_same_instant_all_start(store_url: str) -> None:
    # Each tests the drivers' side of the store exclusively for a moment; a peer doing the same
    # at that instant is no command-line driver, and must not refuse it (three nodes of a
    # cluster started together: one was refused now and then).
    url = normalize_store_url(store_url)
    EventStore.open(url).close()
    starting = [
        subprocess.Popen(
            [sys.executable, "-c", STARTING, url, "40"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = [process.communicate(timeout=120) for process in starting]
    assert [process.returncode for process in starting] == [0] * 4, outcomes
    assert [out.strip() for out, _ in outcomes] == ["0"] * 4, outcomes
