"""Benchmark: 1,000 subscribers on one run's event stream; commit-to-delivery latency.

``salvor serve`` runs as a subprocess. One run walks a plan of ``--steps``
lookups against the scripted provider (in a process of its own, answering
each call after ``--step-delay`` seconds). Its first model call is held at
the provider until every subscriber is connected: ``--subscribers`` streams
(``GET /v1/runs/{id}/events``, httpx under trio) spread over
``--client-processes`` processes, so the clients do not share one
interpreter lock with each other or with the daemon.

Latency of one delivery = the wall clock when the subscriber parsed the
frame minus the event's ``recorded_at`` (the store's clock, read just before
the commit, on the same machine), so it covers the commit itself, the
fan-out, the HTTP write and the client's read. Only events recorded after
the subscribers connected are counted (the replayed head is not live).

Target: p99 <= 50 ms. Prints one JSON object; never a timed assertion.

    python tests/bench/bench_sse.py [--subscribers 1000] [--client-processes 4] [--steps 20] [--dir DIR] [--store URL]

``--store postgresql://...`` runs the daemon on that server, in a schema of
its own dropped at the end (default: a fresh SQLite file in the scratch dir).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import trio

from tests.bench.bench_recover import ServeProcess
from tests.bench.bench_store import add_store_option, bench_store_url
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script

CONTEXT = multiprocessing.get_context("fork")


def _provider_child(steps: int, delay: float, go, connection) -> None:
    def on_call(call) -> None:
        go.wait()
        time.sleep(delay)

    plan = [("lookup_invoice", {"invoice_id": f"INV-{i}"}) for i in range(steps)]
    with ScriptedProvider(tool_loop_script(plan), on_call=on_call) as provider:
        connection.send(provider.base_url)
        connection.recv()


def _epoch(instant: str) -> float:
    return datetime.fromisoformat(instant).timestamp()


def _subscriber_child(base_url: str, run_id: str, streams: int, live_from: int, ready, results) -> None:
    async def main() -> None:
        latencies: list[float] = []
        seqs_ok = 0
        limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
        async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(120), limits=limits) as client:

            async def subscribe() -> None:
                nonlocal seqs_ok
                expected = 0
                async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
                    response.raise_for_status()
                    ready.put(1)
                    async for line in response.aiter_lines():
                        if not line.startswith("data: {\"run_id\""):
                            continue
                        now = time.time()
                        envelope = json.loads(line[6:])
                        if envelope["seq"] != expected:
                            raise AssertionError(f"seq {envelope['seq']} after {expected - 1}")
                        expected += 1
                        if envelope["seq"] >= live_from:
                            latencies.append(now - _epoch(envelope["recorded_at"]))
                seqs_ok += 1

            async with trio.open_nursery() as nursery:
                for _ in range(streams):
                    nursery.start_soon(subscribe)
        results.put((latencies, seqs_ok))

    trio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--dir", type=Path, default=None)
    add_store_option(parser)
    args = parser.parse_args()

    go = CONTEXT.Event()
    parent_end, child_end = CONTEXT.Pipe()
    provider = CONTEXT.Process(target=_provider_child, args=(args.steps, args.step_delay, go, child_end), daemon=True)
    provider.start()
    provider_url = parent_end.recv()
    with (tempfile.TemporaryDirectory(dir=args.dir, prefix="salvor-bench-sse-") as scratch,
          bench_store_url(args.store, Path(scratch)) as url):
        scratch_path = Path(scratch)
        daemon = ServeProcess(url, scratch_path, "--demo-tools")
        daemon.start()
        try:
            with httpx.Client(base_url=daemon.base_url, timeout=60) as client:
                agent_text = (
                    'model = "claude-sonnet-4-5"\nmax_response_tokens = 256\n'
                    f'[llm]\nprovider = "anthropic"\nbase_url = "{provider_url}"\nmax_retries = 0\n'
                    '[[tools]]\nname = "lookup_invoice"\n'
                )
                agent = client.post("/v1/agents", content=agent_text,
                                    headers={"content-type": "application/toml"}).raise_for_status().json()["agent"]
                run_id = client.post("/v1/runs", json={"agent": agent, "input": "look them up"}).raise_for_status().json()["run"]
                # The head and the first model intent are recorded before the provider lets go.
                while client.get(f"/v1/runs/{run_id}").json()["event_count"] < 2:
                    time.sleep(0.01)
                live_from = 2
                ready, results = CONTEXT.Queue(), CONTEXT.Queue()
                shares = [args.subscribers // args.client_processes + (i < args.subscribers % args.client_processes)
                          for i in range(args.client_processes)]
                clients = [CONTEXT.Process(target=_subscriber_child,
                                          args=(daemon.base_url, run_id, n, live_from, ready, results), daemon=True)
                           for n in shares]
                began = time.perf_counter()
                for process in clients:
                    process.start()
                for _ in range(args.subscribers):
                    ready.get(timeout=120)
                connect_seconds = time.perf_counter() - began
                go.set()
                latencies: list[float] = []
                completed_streams = 0
                for _ in clients:
                    got, ok = results.get(timeout=600)
                    latencies.extend(got)
                    completed_streams += ok
                for process in clients:
                    process.join(timeout=30)
                events = client.get(f"/v1/runs/{run_id}").json()["event_count"]
        finally:
            code = daemon.stop()
            parent_end.send("stop")
            provider.join(timeout=10)
    latencies.sort()

    def at(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1000, 2)

    print(json.dumps({
        **({} if args.store is None else {"backend": "postgresql"}),
        "bench": "sse",
        "subscribers": args.subscribers,
        "client_processes": args.client_processes,
        "streams_completed": completed_streams,
        "events_in_run": events,
        "live_events_per_subscriber": events - live_from,
        "deliveries_measured": len(latencies),
        "connect_all_seconds": round(connect_seconds, 3),
        "latency_p50_ms": at(0.5),
        "latency_p90_ms": at(0.9),
        "latency_p99_ms": at(0.99),
        "latency_max_ms": round(latencies[-1] * 1000, 2),
        "target_p99_ms": 50,
        "meets_target": at(0.99) <= 50,
        "exit_code_after_sigterm": code,
        "python": sys.version.split()[0],
    }))


if __name__ == "__main__":
    main()
