"""Group commit through the daemon's writer, on a real SQLite file: the appends that trio tasks
make together share transactions, and each caller hears its own rows."""

from __future__ import annotations

import threading

import trio
from salvor.daemon.recording import open_store_access
from salvor.protocol import EMPTY_VIEW, RunStarted

RUNS = 40


def started(task: str) -> RunStarted:
    return RunStarted(agent_def_hash="sha256:agent", input={"task": task})


async def test_appends_made_together_by_many_tasks_share_a_few_transactions(tmp_path) -> None:
    transactions: list[int] = []
    lock = threading.Lock()

    def observed(events: int, seconds: float, appends: int) -> None:
        with lock:
            transactions.append(events)

    # Each drive sends on a socket before it appends, as one sends its model request: a
    # system call that lets the writer thread run in the middle of the trio thread's batch.
    left, right = trio.socket.socketpair()
    recorded: dict[str, int] = {}
    async with open_store_access(str(tmp_path / "runs.db"), commit_observer=observed) as access:

        async def drive(index: int) -> None:
            run_id = f"run-{index}"
            await left.send(b"x")
            envelopes, view = await access.append(run_id, [started(run_id)], EMPTY_VIEW)
            recorded[run_id] = envelopes[0].seq
            assert view.next_seq == 1

        async with trio.open_nursery() as nursery:
            for index in range(RUNS):
                nursery.start_soon(drive, index)
        logs = {f"run-{i}": access.store.read_log(f"run-{i}") for i in range(RUNS)}
    left.close()
    right.close()
    assert recorded == {f"run-{i}": 0 for i in range(RUNS)}
    assert all(len(log) == 1 for log in logs.values())
    assert sum(transactions) == RUNS
    # One transaction per append would be RUNS of them; a batch's appends go together.
    assert len(transactions) <= RUNS // 4, transactions
