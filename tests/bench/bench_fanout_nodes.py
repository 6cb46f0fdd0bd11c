"""Benchmark: commit-to-delivery on one daemon's SSE streams, for runs the daemon commits itself
(same node) against runs another process commits into the same store (cross node).

``salvor serve`` runs as a subprocess over the store. Two writers commit at once, each into
``--runs`` runs of its own, one event per transaction, ``--events`` events in all, paced at
``--rate`` commits a second each so nothing queues:

* same node: client-driven runs, each event sent to the daemon (``POST
  /v1/client-runs/{id}/events``): the daemon commits it and publishes it to its hub;
* cross node: a plain writer process (``tests/support/store_writer.py``: ``EventStore.open``
  and ``append``, as another node's driver does); the daemon hears of it only through its change
  feed (LISTEN/NOTIFY on PostgreSQL, data_version on SQLite) and reads it from the store.

One subscriber process holds an SSE stream on every run (a lean HTTP/1.1 reader on a trio
socket, ``bench_sse.StreamReader``) and checks that each seq arrives once, in order. Latency of
one delivery = the wall clock when the subscriber parsed the frame minus the event's
``recorded_at`` (the committing process's clock, read just before its commit, on this machine),
so both sides cover the commit itself, the fan-out, the HTTP write and the client's read; the
payload also carries each writer's ``time.time()`` from before it asked for the commit (the same
node's includes its HTTP request), printed beside.

Target: cross-node p99 <= 2x the same-node p99. Prints one JSON object; never a timed assertion.

    python tests/bench/bench_fanout_nodes.py [--runs 10] [--events 1000] [--rate 50]
    [--dir DIR] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import trio

from tests.bench.bench_recover import ServeProcess
from tests.bench.bench_sse import StreamReader, _data, _epoch, _percentiles
from tests.bench.bench_store import add_store_option, bench_store_url
from tests.support.client_events import envelope
from tests.support.store_writer import AGENT, StoreWriter

CONTEXT = multiprocessing.get_context("fork")


def _subscriber_child(base_url: str, runs: dict[str, str], ready, results) -> None:
    """One stream per run of ``runs`` (run id -> kind); reports latencies by kind once every
    stream has delivered what the writers said they committed (``results`` gets them)."""

    async def main() -> None:
        by_kind: dict[str, list[tuple[float, float]]] = {kind: [] for kind in set(runs.values())}
        expected: dict[str, int] = {}

        async def subscribe(run_id: str, kind: str, task_status) -> None:
            reader = await StreamReader.open(base_url, f"/v1/runs/{run_id}/events")
            task_status.started()
            next_seq = 0
            async with reader.stream:
                async for frame in reader.frames():
                    data = _data(frame)
                    if data is None or frame.startswith(b"event: end"):
                        continue
                    now = time.time()
                    body = json.loads(data)
                    if body["seq"] != next_seq:
                        raise AssertionError(
                            f"run {run_id}: seq {body['seq']} after {next_seq - 1}"
                        )
                    next_seq += 1
                    if body["event"]["kind"] == "RandomObserved":
                        by_kind[kind].append(
                            (
                                now - _epoch(body["recorded_at"]),
                                now - float(body["event"]["payload"]["value"]),
                            )
                        )
                    expected[run_id] = next_seq

        async with trio.open_nursery() as nursery:
            for run_id, kind in runs.items():
                await nursery.start(subscribe, run_id, kind)
            ready.put(1)
            # The writers' word: every run's last seq once they are done.
            last = await trio.to_thread.run_sync(ready.get)
            while any(expected.get(run_id, 0) <= seq for run_id, seq in last.items()):
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        results.put(by_kind)

    trio.run(main)


def _pace(events: int, rate: float, runs: list[str], commit) -> None:
    began = time.perf_counter()
    for n in range(events):
        due = began + n / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        commit(runs[n % len(runs)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per writer")
    parser.add_argument("--events", type=int, default=1000, help="events per writer")
    parser.add_argument("--rate", type=float, default=50.0, help="commits a second per writer")
    parser.add_argument("--dir", type=Path, default=None)
    add_store_option(parser)
    args = parser.parse_args()
    scratch = args.dir or Path(tempfile.mkdtemp(prefix="bench-fanout-nodes-"))
    scratch.mkdir(parents=True, exist_ok=True)
    with bench_store_url(args.store, scratch) as store_url:
        print(json.dumps(_measure(store_url, scratch, args)))


def _measure(store_url: str, scratch: Path, args) -> dict:
    same = [str(uuid.uuid4()) for _ in range(args.runs)]
    cross = [str(uuid.uuid4()) for _ in range(args.runs)]
    serve = ServeProcess(store_url, scratch)
    try:
        serve.start()
    except BaseException:
        print(serve.log(), file=sys.stderr)
        raise
    writer = StoreWriter.start(store_url)
    try:
        client = httpx.Client(base_url=serve.base_url, timeout=30)
        tokens, seqs = {}, {}
        for run_id in same:
            response = client.post("/v1/client-runs", json={})
            response.raise_for_status()
            body = response.json()
            run = body["run"]
            tokens[run], seqs[run] = body["drive_token"], 0
        same = list(tokens)
        for run_id in same:
            head = envelope(run_id, 0, "RunStarted", {"agent_def_hash": AGENT, "input": None})
            _send(client, tokens, run_id, head)
        for run_id in cross:
            seqs[run_id] = writer.ask_now("head", run_id)

        ready, results = CONTEXT.Queue(), CONTEXT.Queue()
        kinds = {**dict.fromkeys(same, "same_node"), **dict.fromkeys(cross, "cross_node")}
        subscriber = CONTEXT.Process(
            target=_subscriber_child, args=(serve.base_url, kinds, ready, results)
        )
        subscriber.start()
        ready.get(timeout=60)

        def commit_here(run_id: str) -> None:
            seqs[run_id] += 1
            event = envelope(
                run_id, seqs[run_id], "RandomObserved", {"value": f"{time.time():.6f}"}
            )
            _send(client, tokens, run_id, event)

        def commit_elsewhere(run_id: str) -> None:
            seqs[run_id] = writer.ask_now("observe", run_id, 1)

        threads = [
            threading.Thread(target=_pace, args=(args.events, args.rate, same, commit_here)),
            threading.Thread(target=_pace, args=(args.events, args.rate, cross, commit_elsewhere)),
        ]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - began
        ready.put(dict(seqs))
        by_kind = results.get(timeout=120)
        subscriber.join(timeout=30)
        client.close()
    finally:
        writer.close()
        serve.stop()
    figures = {}
    for kind, pairs in by_kind.items():
        committed = sorted(pair[0] for pair in pairs)
        asked = sorted(pair[1] for pair in pairs)
        figures[kind] = {
            "deliveries": len(pairs),
            **_percentiles(committed),
            "from_the_writers_clock": _percentiles(asked),
        }
    ratio = round(figures["cross_node"]["p99_ms"] / figures["same_node"]["p99_ms"], 2)
    return {
        "bench": "fanout_nodes",
        "backend": "postgresql" if store_url.startswith("postgresql") else "sqlite",
        "runs_per_writer": args.runs,
        "events_per_writer": args.events,
        "commits_per_second_per_writer": args.rate,
        "seconds": round(seconds, 2),
        "same_node": figures["same_node"],
        "cross_node": figures["cross_node"],
        "cross_p99_vs_same_p99": ratio,
        "target_cross_p99_vs_same_p99": 2.0,
        "meets_target": ratio <= 2.0,
        "load": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


def _send(client: httpx.Client, tokens: dict, run_id: str, event: dict) -> None:
    response = client.post(
        f"/v1/client-runs/{run_id}/events",
        json={"events": [event]},
        headers={"X-Drive-Token": tokens[run_id]},
    )
    response.raise_for_status()


if __name__ == "__main__":
    main()
