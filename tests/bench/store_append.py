"""Benchmark: one durable store append against one raw sqlite3 commit on the same file.

Prints JSON. An append here is two events (a model intent and its
completion) plus the run's ``runs`` row, in one transaction and one commit;
the baseline is one INSERT + COMMIT through the stdlib ``sqlite3`` module
with the same pragmas (WAL, synchronous=FULL). Never a timed assertion.

    python tests/bench/store_append.py [--seconds 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path

from salvor.protocol import EMPTY_VIEW, ModelCallCompleted, ModelCallRequested, RunStarted
from salvor.store import EventStore


def raw_commits(path: Path, seconds: float) -> float:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("CREATE TABLE IF NOT EXISTS raw (k INTEGER PRIMARY KEY, v TEXT)")
    count = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("INSERT INTO raw (v) VALUES (?)", ('{"request_hash":"sha256:x"}',))
        connection.execute("COMMIT")
        count += 1
    elapsed = time.perf_counter() - start
    connection.close()
    return count / elapsed


def store_appends(path: Path, seconds: float) -> float:
    store = EventStore.open(str(path))
    _, view = store.append(
        "bench", [RunStarted(agent_def_hash="sha256:bench", input=None)], EMPTY_VIEW
    )
    usage = {"input_tokens": 12, "output_tokens": 34}
    count = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        seq = view.next_seq
        _, view = store.append(
            "bench",
            [
                ModelCallRequested(request_hash="sha256:x"),
                ModelCallCompleted(seq=seq, response={"text": "ok"}, usage=usage),
            ],
            view,
        )
        count += 1
    elapsed = time.perf_counter() - start
    store.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        path = Path(scratch) / "bench.db"
        raw, store = [], []
        # Interleaved rounds on the same file, so disk noise hits both alike.
        for _ in range(args.rounds):
            raw.append(raw_commits(path, args.seconds))
            store.append(store_appends(path, args.seconds))
            with sqlite3.connect(path) as connection:
                connection.execute("DELETE FROM events")
                connection.execute("DELETE FROM runs")
    best_raw, best_store = max(raw), max(store)
    print(
        json.dumps(
            {
                "raw_commits_per_second": round(best_raw),
                "store_appends_per_second": round(best_store),
                "append_cost_vs_raw_commit": round(best_raw / best_store, 3),
                "rounds": {"raw": [round(r) for r in raw], "store": [round(s) for s in store]},
            }
        )
    )


if __name__ == "__main__":
    main()
