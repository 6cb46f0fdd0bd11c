"""Benchmark: 1,000 runs live on 10 WebSocket connections; commit-to-delivery latency, beside the
same events over SSE.

``salvor serve`` runs as a subprocess. ``--runs`` client-driven runs are opened (each with its
head recorded), then watched: over ``--connections`` WebSockets (``/v1/ws``, each subscribed to
its share of the runs), spread over ``--client-processes`` processes. A driver then commits
``--events`` rounds, one event into every run per round (``POST
/v1/client-runs/{id}/events``, the client-driven append), a round every ``--interval`` seconds.

The same script then does it all again on a fresh daemon and store with one SSE stream per run
(``GET /v1/runs/{id}/events``, 1,000 streams): the same runs, the same events, the same driver,
so the two transports are compared on one workload, in one run, on one machine.
(``bench_sse`` measures another shape: one run with 1,000 streams, against a bare hypercorn
floor; its p99 is the figure issue 17 names, and ``sse_same_events`` here is this workload's.)

Latency of one delivery = the wall clock when the subscriber parsed the event minus its
``recorded_at`` (the store's clock, read just before the commit, on the same machine). Every
seq must arrive once, in order. The subscribers are lean (trio-websocket; for SSE the raw
chunked reader of ``bench_sse``) so that the clients, which share the cores with the daemon,
do not measure themselves.

Target: WebSocket p99 within 1.5x the SSE p99 of the same events. Prints one JSON object;
never a timed assertion.

    python tests/bench/bench_ws.py [--runs 1000] [--connections 10] [--events 10]
    [--interval 1.0] [--client-processes 2] [--dir DIR] [--store URL]
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
from trio_websocket import open_websocket_url

from tests.bench.bench_recover import ServeProcess
from tests.bench.bench_sse import StreamReader, _data, _percentiles
from tests.bench.bench_store import add_store_option, bench_store_url

CONTEXT = multiprocessing.get_context("fork")
AGENT = "sha256:" + "be" * 32
DRIVER_CONNECTIONS = 8


def _epoch(instant: str) -> float:
    return datetime.fromisoformat(instant).timestamp()


def _envelope(run_id: str, seq: int, event: dict) -> dict:
    return {
        "run_id": run_id,
        "seq": seq,
        "schema_version": 1,
        "recorded_at": "1970-01-01T00:00:00.000000Z",
        "event": event,
    }


def open_runs(base_url: str, count: int) -> dict[str, str]:
    """``count`` client-driven runs, each with its head recorded: run id -> drive token."""
    runs = {}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for _ in range(count):
            opened = client.post("/v1/client-runs", json={}).raise_for_status().json()
            run_id, token = opened["run"], opened["drive_token"]
            head = {"kind": "RunStarted", "payload": {"agent_def_hash": AGENT, "input": None}}
            client.post(
                f"/v1/client-runs/{run_id}/events",
                json={"events": [_envelope(run_id, 0, head)]},
                headers={"X-Drive-Token": token},
            ).raise_for_status()
            runs[run_id] = token
    return runs


class Appender:
    """Keep-alive HTTP/1.1 connections that post appends and read their answers, one at a time
    (a lean client: httpx would spend more CPU per request than the daemon does). hypercorn
    closes a connection after its 1,000th request (``Connection: close``); the next opens anew."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.stream: trio.SocketStream | None = None
        self.buffer = b""

    async def _receive(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise EOFError("the daemon closed the connection mid-answer")
        self.buffer += data

    async def append(self, run_id: str, token: str, seq: int) -> None:
        if self.stream is None:
            self.stream, self.buffer = await trio.open_tcp_stream(self.host, self.port), b""
        event = {"kind": "RandomObserved", "payload": {"value": f"{seq:08x}"}}
        body = json.dumps({"events": [_envelope(run_id, seq, event)]}).encode()
        await self.stream.send_all(
            (
                f"POST /v1/client-runs/{run_id}/events HTTP/1.1\r\n"
                f"Host: {self.host}:{self.port}\r\n"
                f"X-Drive-Token: {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        while b"\r\n\r\n" not in self.buffer:
            await self._receive()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 200"):
            raise AssertionError(head.decode(errors="replace"))
        fields = dict(
            line.lower().split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line
        )
        length = int(fields[b"content-length"])
        while len(self.buffer) < length:
            await self._receive()
        self.buffer = self.buffer[length:]
        if fields.get(b"connection", b"").strip() == b"close":
            await self.aclose()

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None


def drive(base_url: str, runs: dict[str, str], rounds: int, interval: float) -> float:
    """Commit ``rounds`` rounds (one event into every run each), one round every ``interval``
    seconds; returns the mean seconds a round's appends took."""

    async def main() -> float:
        host, port = base_url.split("://", 1)[1].rsplit(":", 1)
        appenders = [Appender(host, int(port)) for _ in range(DRIVER_CONNECTIONS)]
        items = list(runs.items())
        took = 0.0
        for round_index in range(rounds):
            began = trio.current_time()
            shares = [items[i :: len(appenders)] for i in range(len(appenders))]

            async def post(appender: Appender, share, seq: int = round_index + 1) -> None:
                for run_id, token in share:
                    await appender.append(run_id, token, seq)

            async with trio.open_nursery() as nursery:
                for appender, share in zip(appenders, shares, strict=True):
                    nursery.start_soon(post, appender, share)
            took += trio.current_time() - began
            await trio.sleep(max(0.0, interval - (trio.current_time() - began)))
        for appender in appenders:
            await appender.aclose()
        return took / rounds

    return trio.run(main)


def _ws_child(base_url: str, shares: list[list[str]], events: int, ready, results) -> None:
    """One process of WebSocket subscribers: a connection per share of runs."""

    async def main() -> None:
        latencies: list[float] = []
        url = base_url.replace("http://", "ws://") + "/v1/ws"

        async def connection(run_ids: list[str]) -> None:
            expected = dict.fromkeys(run_ids, 1)
            statuses = 0
            async with open_websocket_url(url, message_queue_size=1024) as ws:
                for run_id in run_ids:
                    await ws.send_message(
                        json.dumps({"op": "subscribe", "run": run_id, "from_seq": 1})
                    )
                while statuses < len(run_ids):
                    statuses += json.loads(await ws.get_message())["type"] == "status"
                ready.put(len(run_ids))
                remaining = len(run_ids) * events
                while remaining:
                    text = await ws.get_message()
                    now = time.time()
                    message = json.loads(text)
                    if message["type"] != "event":
                        continue
                    envelope = message["event"]
                    run_id = message["run"]
                    if envelope["seq"] != expected[run_id]:
                        raise AssertionError(f"seq {envelope['seq']} after {expected[run_id] - 1}")
                    expected[run_id] += 1
                    latencies.append(now - _epoch(envelope["recorded_at"]))
                    remaining -= 1

        async with trio.open_nursery() as nursery:
            for share in shares:
                nursery.start_soon(connection, share)
        results.put(latencies)

    trio.run(main)


def _sse_child(base_url: str, run_ids: list[str], events: int, ready, results) -> None:
    """One process of SSE subscribers: a stream per run."""

    async def main() -> None:
        latencies: list[float] = []

        async def stream(run_id: str) -> None:
            expected = 1
            reader = await StreamReader.open(base_url, f"/v1/runs/{run_id}/events?from_seq=1")
            ready.put(1)
            async with reader.stream:
                async for frame in reader.frames():
                    data = _data(frame)
                    if data is None:
                        continue
                    now = time.time()
                    envelope = json.loads(data)
                    if envelope["seq"] != expected:
                        raise AssertionError(f"seq {envelope['seq']} after {expected - 1}")
                    expected += 1
                    latencies.append(now - _epoch(envelope["recorded_at"]))
                    if expected > events:
                        return

        async with trio.open_nursery() as nursery:
            for run_id in run_ids:
                nursery.start_soon(stream, run_id)
        results.put(latencies)

    trio.run(main)


def measure(transport: str, args, scratch: Path) -> dict:
    """One daemon, one store, ``args.runs`` runs watched over ``transport``; the figures."""
    with bench_store_url(args.store, scratch, f"{transport}.db") as url:
        # Every subscriber is on loopback: one client, past the default cap of open streams.
        daemon = ServeProcess(url, scratch, "--max-streams-per-client", "0")
        daemon.start()
        try:
            runs = open_runs(daemon.base_url, args.runs)
            run_ids = list(runs)
            ready, results = CONTEXT.Queue(), CONTEXT.Queue()
            processes = args.client_processes
            if transport == "ws":
                shares = [run_ids[i :: args.connections] for i in range(args.connections)]
                per_process = [shares[i::processes] for i in range(processes)]
                clients = [
                    CONTEXT.Process(
                        target=_ws_child,
                        args=(daemon.base_url, mine, args.events, ready, results),
                        daemon=True,
                    )
                    for mine in per_process
                ]
            else:
                processes = max(processes, 4)
                clients = [
                    CONTEXT.Process(
                        target=_sse_child,
                        args=(daemon.base_url, run_ids[i::processes], args.events, ready, results),
                        daemon=True,
                    )
                    for i in range(processes)
                ]
            began = time.perf_counter()
            for process in clients:
                process.start()
            subscribed = 0
            while subscribed < args.runs:
                subscribed += ready.get(timeout=300)
            connect_seconds = time.perf_counter() - began
            round_seconds = drive(daemon.base_url, runs, args.events, args.interval)
            latencies: list[float] = []
            for _ in clients:
                latencies.extend(results.get(timeout=600))
            for process in clients:
                process.join(timeout=30)
        finally:
            code = daemon.stop()
    latencies.sort()
    figures = _percentiles(latencies)
    return {
        "subscribers": args.connections if transport == "ws" else args.runs,
        "client_processes": len(clients),
        "deliveries_measured": len(latencies),
        "deliveries_expected": args.runs * args.events,
        "subscribe_all_seconds": round(connect_seconds, 3),
        "round_append_seconds_mean": round(round_seconds, 3),
        "latency_p50_ms": figures["p50_ms"],
        "latency_p90_ms": figures["p90_ms"],
        "latency_p99_ms": figures["p99_ms"],
        "latency_max_ms": figures["max_ms"],
        "exit_code_after_sigterm": code,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None)
    add_store_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="salvor-bench-ws-") as scratch:
        ws = measure("ws", args, Path(scratch))
        sse = measure("sse", args, Path(scratch))
    print(
        json.dumps(
            {
                **({} if args.store is None else {"backend": "postgresql"}),
                "bench": "ws",
                "runs": args.runs,
                "events_per_run": args.events,
                "round_interval_seconds": args.interval,
                "ws": ws,
                "sse_same_events": sse,
                "ws_p99_vs_sse_p99": round(ws["latency_p99_ms"] / sse["latency_p99_ms"], 2),
                "target_ratio": 1.5,
                "meets_target": ws["latency_p99_ms"] <= 1.5 * sse["latency_p99_ms"],
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
