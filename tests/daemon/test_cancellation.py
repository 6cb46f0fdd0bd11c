"""Cancellation in the daemon states its reason, and the waits a stop depends on have a bound.

* Every ``cancel()`` in ``daemon/`` names why (read from the source: a new
  bare ``cancel()`` fails here, whoever adds it).
* An append whose writer thread died fails at once with a store fault
  instead of waiting forever; so does every append after it.
* A stop abandons an append the writer never confirms once the drain
  deadline has passed, and names the run.
* Nothing blocks the trio thread: git at start runs as a child process trio
  waits on; a notification to systemd never waits for systemd to read.
"""

from __future__ import annotations

import ast
import inspect
import os
import socket
import threading
from pathlib import Path

import pytest
import salvor.daemon
import trio
import trio.testing
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.runs._drivers import DRAIN_SECONDS, DriverSet
from salvor.daemon.serve._notify import Notifier
from salvor.daemon.serve._server_state import build_commit
from salvor.store import StoreUnavailable, store_fault

DAEMON = Path(salvor.daemon.__file__).resolve().parent


def _bare_cancels(path: Path) -> list[str]:
    """``x.cancel()`` calls in ``path`` that give trio no reason (no argument at all)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "cancel"
            and not node.args
            and not node.keywords
        ):
            found.append(f"{path.relative_to(DAEMON.parent)}:{node.lineno}")
    return found


def test_every_cancel_in_the_daemon_states_its_reason() -> None:
    bare = [site for path in sorted(DAEMON.rglob("*.py")) for site in _bare_cancels(path)]
    assert bare == [], "cancel() without a reason: " + ", ".join(bare)


AGENT = (
    'model = "scripted-model"\nsystem_prompt = "You settle refunds."\n'
    '[llm]\nbase_url = "http://127.0.0.1:9"\n'  # never reached: these drives stop first
)


class WriterKilled(BaseException):
    """What kills the writer thread here: nothing the write loop's ``except Exception`` catches."""


async def test_an_append_whose_writer_thread_died_fails_at_once_and_so_does_every_later_one(
    runtime,
) -> None:
    agent = parse_definition(AGENT, "toml")
    survivor = await runtime.starts.start_run(agent, "before")

    def killed(requests):
        raise WriterKilled()

    runtime.access.store.append_batch = killed
    # A real bound, not virtual time: autojump_clock does not wait for the writer thread.
    with trio.fail_after(10):
        with pytest.raises(StoreUnavailable) as first:
            await runtime.starts.start_run(agent, "during")
        with pytest.raises(StoreUnavailable) as later:
            await runtime.starts.start_run(agent, "after")
        with pytest.raises(StoreUnavailable):
            await runtime.access.check_writable()
    assert "writer thread died (WriterKilled)" in first.value.message
    assert "whether it was committed is not known" in first.value.message
    assert not store_fault(first.value)  # a dead writer does not heal: healing would retry in vain
    assert "writer thread died (WriterKilled)" in later.value.message
    assert "nothing of this append was written" in later.value.message
    assert [e.seq for e in runtime.access.store.read_log(survivor)] == [0]


async def test_a_stop_ends_by_its_drain_deadline_when_a_driver_waits_on_a_writer_that_never_answers(
    runtime, autojump_clock, caplog
) -> None:
    agent = parse_definition(AGENT, "toml")
    run_id = await runtime.starts.start_run(agent, "stuck")
    entered, release = threading.Event(), threading.Event()
    append_batch = runtime.access.store.append_batch

    def hung(requests):
        # A database that takes the write and never answers (a lock, a lost peer).
        entered.set()
        release.wait(60)
        return append_batch(requests)

    runtime.access.store.append_batch = hung
    try:
        async with trio.open_nursery() as nursery:
            drivers = DriverSet(runtime, nursery)
            drivers.start(run_id, agent)
            # The drive records its model call's intent first (write-ahead): that append hangs.
            assert await trio.to_thread.run_sync(entered.wait, 10)
            await trio.testing.wait_all_tasks_blocked()
            began = trio.current_time()
            with trio.fail_after(
                DRAIN_SECONDS + 1
            ):  # virtual time: the drain deadline is what ends it
                left = await drivers.stop("the test stops", drain_seconds=DRAIN_SECONDS)
            assert left == [run_id]
            assert trio.current_time() - began >= DRAIN_SECONDS
        assert not drivers.driving(run_id)
    finally:
        release.set()
    messages = [record.getMessage() for record in caplog.records]
    assert any("did not drain" in text and run_id in text for text in messages), messages
    assert any(
        f"run {run_id}: drive stopped: the daemon stopped while this append was being committed"
        in text
        for text in messages
    ), messages


FAKE_GIT = """#!/bin/sh
# Answers only once the test's trio task has made the gate: a git run on the
# trio thread blocks that task, so it would never answer.
n=0
while [ ! -e "$SALVOR_TEST_GATE" ] && [ $n -lt 1000 ]; do sleep 0.01; n=$((n+1)); done
[ -e "$SALVOR_TEST_GATE" ] || exit 1
case "$3" in rev-parse) echo abc1234 ;; esac
"""


async def test_the_build_commit_is_read_by_a_git_that_does_not_block_the_trio_thread(
    tmp_path, monkeypatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(FAKE_GIT)
    (bin_dir / "git").chmod(0o755)
    gate = tmp_path / "gate"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SALVOR_TEST_GATE", str(gate))
    found: list[str | None] = []

    async def read_commit() -> None:
        commit = build_commit()
        found.append(await commit if inspect.isawaitable(commit) else commit)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_commit)
            await trio.testing.wait_all_tasks_blocked()
            await trio.Path(gate).touch()
    assert found == ["abc1234"]


async def test_a_notification_to_a_systemd_that_stopped_reading_never_blocks(tmp_path) -> None:
    address = tmp_path / "notify"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(address))
    notifier = Notifier({"NOTIFY_SOCKET": str(address)})

    def flood() -> None:
        # Far more datagrams than the unread queue holds: a blocking send would stop at its end.
        for _ in range(5000):
            notifier.send("WATCHDOG=1")

    try:
        with trio.fail_after(10):
            await trio.to_thread.run_sync(flood, abandon_on_cancel=True)
    finally:
        receiver.close()  # a send still blocked (the old way) fails now, and its thread ends
