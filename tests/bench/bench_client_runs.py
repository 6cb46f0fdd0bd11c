"""Benchmark: client-driven runs appending through the guarded append, one event per request.

``salvor serve`` runs as a subprocess over a fresh store. ``--runs`` client-
driven runs (default 100) are opened and each appends ``--events`` events
(default 100: its RunStarted, then NowObserved readings) one request at a
time, through ``POST /v1/client-runs/{id}/events`` with its drive token. The
clients run in ``--client-processes`` processes of their own (a lean
keep-alive HTTP/1.1 client under trio, one connection per run), so their work
does not share the daemon's interpreter lock. Default 2: on a 2-core machine
one client process was itself the limit (the bare hypercorn baseline below
measured ~2,400 requests/s with one and ~3,000 with two), and more than two
take cores from the daemon.

Measured: appended events per second from the first append until the last
run's last append. Baselines from the same run, with the same clients: the
daemon's cheapest route (``GET /v1/capabilities``: the routing and the HTTP
stack, no store), a bare ASGI app answering a constant behind hypercorn's own
``serve`` and behind the daemon's listener (``daemon/web/_listener.py``: the
same hypercorn protocol, one keep-alive watcher per connection): the HTTP
stack's own ceilings; and the store's raw rate for single-event appends
(``EventStore.append`` in a loop, no HTTP).

Target: >= 2,000 events/s. Prints one JSON object; never a timed assertion.

    python tests/bench/bench_client_runs.py [--runs 100] [--events 100]
    [--client-processes 2] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio

from tests.bench.bench_recover import ServeProcess
from tests.bench.bench_store import add_store_option, bench_store_url
from tests.bench.keep_alive import connect

CONTEXT = multiprocessing.get_context("spawn")
AGENT = "sha256:" + "ab" * 32


def _envelope(run_id: str, seq: int, kind: str, payload: dict) -> dict:
    return {
        "run_id": run_id,
        "seq": seq,
        "schema_version": 1,
        "recorded_at": "2026-01-01T00:00:00.000000Z",
        "event": {"kind": kind, "payload": payload},
    }


async def _drive(base_url: str, events: int) -> None:
    connection = await connect(base_url)
    status, body = await connection.request("POST", "/v1/client-runs", {})
    opened = json.loads(body)
    run_id, headers = opened["run"], {"X-Drive-Token": opened["drive_token"]}
    for seq in range(events):
        if seq == 0:
            event = _envelope(run_id, 0, "RunStarted", {"agent_def_hash": AGENT, "input": {"n": 1}})
        else:
            event = _envelope(
                run_id, seq, "NowObserved", {"now": f"2026-11-29T10:00:{seq % 60:02d}.{seq:06d}Z"}
            )
        status, answer = await connection.request(
            "POST", f"/v1/client-runs/{run_id}/events", {"events": [event]}, headers
        )
        if status != 200:
            raise SystemExit(f"append {seq} of {run_id}: {status} {answer[:300]!r}")


async def _ping(base_url: str, count: int) -> None:
    connection = await connect(base_url)
    for _ in range(count):
        status, _ = await connection.request("GET", "/v1/capabilities")
        if status != 200:
            raise SystemExit(f"capabilities answered {status}")


def _client(base_url: str, runs: int, events: int, mode: str, go, done) -> None:
    async def main() -> None:
        await trio.to_thread.run_sync(go.wait)
        began = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(runs):
                nursery.start_soon(_drive if mode == "append" else _ping, base_url, events)
        done.put((began, time.perf_counter()))

    trio.run(main)


def _fan_out(base_url: str, runs: int, events: int, processes: int, mode: str) -> float:
    """Seconds from the first client's start to the last client's end."""
    go, done = CONTEXT.Event(), CONTEXT.Queue()
    shares = [runs // processes + (1 if i < runs % processes else 0) for i in range(processes)]
    workers = [
        CONTEXT.Process(target=_client, args=(base_url, share, events, mode, go, done))
        for share in shares
        if share
    ]
    for worker in workers:
        worker.start()
    time.sleep(1.0)  # let every client import and connect
    go.set()
    spans = [done.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    return max(end for _, end in spans) - min(start for start, _ in spans)


# The ceiling of the HTTP stack itself: hypercorn on trio with an ASGI app that
# answers every request with a constant, no routing, no JSON, no store.
_BARE_ASGI = """
import sys, trio
from hypercorn.config import Config
from hypercorn.trio import serve
from salvor.daemon.web._asgi import answer_lifespan

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})

config = Config()
config.bind = [sys.argv[1]]
config.accesslog = None
if sys.argv[2] == "salvor":  # the same hypercorn protocol under salvor's own connection handler
    from salvor.daemon.web._listener import serve
trio.run(serve, app, config)
"""


def _bare_http_rate(runs: int, events: int, processes: int, listener: str) -> float:
    """Requests/s of the constant app behind ``listener``: "hypercorn" (its own serve)
    or "salvor" (the daemon's)."""
    from tests.bench.bench_recover import free_port, wait_for_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", _BARE_ASGI, f"127.0.0.1:{port}", listener])
    try:
        wait_for_port(port)
        return runs * events / _fan_out(f"http://127.0.0.1:{port}", runs, events, processes, "ping")
    finally:
        server.terminate()
        server.wait()


def _raw_store_rate(store_url: str, events: int) -> float:
    from salvor.protocol import EMPTY_VIEW, NowObserved, RunStarted
    from salvor.store import EventStore

    with EventStore.open(store_url) as store:
        run_id = str(uuid.uuid4())
        _, view = store.append(run_id, [RunStarted(agent_def_hash=AGENT, input=None)], EMPTY_VIEW)
        began = time.perf_counter()
        for i in range(events):
            _, view = store.append(run_id, [NowObserved(now=f"2026-11-29T10:00:00.{i:06d}Z")], view)
        return events / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--dir", default=None)
    add_store_option(parser)
    args = parser.parse_args()
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench_client_runs_"))
    with bench_store_url(args.store, scratch) as store_url:
        daemon = ServeProcess(store_url, scratch)
        daemon.start()
        try:
            seconds = _fan_out(
                daemon.base_url, args.runs, args.events, args.client_processes, "append"
            )
            ping_seconds = _fan_out(
                daemon.base_url, args.runs, args.events, args.client_processes, "ping"
            )
        finally:
            daemon.stop()
        total = args.runs * args.events
        raw = _raw_store_rate(store_url, 1000)
    bare = _bare_http_rate(args.runs, args.events, args.client_processes, "hypercorn")
    bare_salvor = _bare_http_rate(args.runs, args.events, args.client_processes, "salvor")
    rate = total / seconds
    print(
        json.dumps(
            {
                "runs": args.runs,
                "events_per_run": args.events,
                "client_processes": args.client_processes,
                "store": "postgresql" if args.store else "sqlite",
                "events": total,
                "seconds": round(seconds, 3),
                "events_per_s": round(rate, 1),
                "baseline_capabilities_requests_per_s": round(total / ping_seconds, 1),
                "baseline_bare_hypercorn_requests_per_s": round(bare, 1),
                "baseline_bare_salvor_listener_requests_per_s": round(bare_salvor, 1),
                "baseline_raw_single_appends_per_s": round(raw, 1),
                "target_events_per_s": 2000,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
