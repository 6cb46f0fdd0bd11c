"""Another process writing into a store, as another node does: it opens the store with
``EventStore.open`` and appends, one transaction per event, when its reader says so.

``python -m tests.support.store_writer STORE_URL`` reads commands from stdin, one a line, and
answers each with one line on stdout once it is durable:

* ``head RUN_ID``: the run's first event (``RunStarted``); answers ``0``.
* ``observe RUN_ID COUNT``: ``COUNT`` events (``RandomObserved``, each its own transaction),
  each carrying the writer's ``time.time()`` just before its append as its value (what the
  fan-out benchmark measures from); answers the last seq.
* ``quit``.

Used through ``StoreWriter`` (trio) by the tests, and by ``tests/bench/bench_fanout_nodes.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

AGENT = "sha256:" + "ab" * 32
REPO = Path(__file__).resolve().parents[2]


def main(store_url: str) -> None:
    from salvor.protocol import EMPTY_VIEW, RandomObserved, RunStarted
    from salvor.store import EventStore

    views = {}
    with EventStore.open(store_url) as store:
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "quit":
                return
            run_id = words[1]
            if words[0] == "head":
                started = RunStarted(agent_def_hash=AGENT, input=None)
                _, views[run_id] = store.append(run_id, [started], EMPTY_VIEW)
            else:
                for _ in range(int(words[2])):
                    event = RandomObserved(value=f"{time.time():.6f}")
                    _, views[run_id] = store.append(run_id, [event], views[run_id])
            print(views[run_id].next_seq - 1, flush=True)


class StoreWriter:
    """The writer process, for a test: ``await writer.ask("observe", run_id, 3)``."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    @classmethod
    def start(cls, store_url: str) -> StoreWriter:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.store_writer", store_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO,
            env=env,
            text=True,
        )
        return cls(process)

    def ask_now(self, *words: object) -> int:
        """Send one command and wait for its answer (blocking: from a thread)."""
        self.process.stdin.write(" ".join(map(str, words)) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the store writer exited ({self.process.wait()})")
        return int(answer)

    async def ask(self, *words: object) -> int:
        import trio

        return await trio.to_thread.run_sync(self.ask_now, *words)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    main(sys.argv[1])
