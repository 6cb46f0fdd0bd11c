"""Benchmark: 1,000 subscribers on one run's event stream; commit-to-delivery latency.

``salvor serve`` runs as a subprocess. One run walks a plan of ``--steps``
lookups against the scripted provider (in a process of its own, answering
each call after ``--step-delay`` seconds). Its first model call is held at
the provider until every subscriber is connected: ``--subscribers`` streams
(``GET /v1/runs/{id}/events``) spread over ``--client-processes`` processes.
Each subscriber is a lean HTTP/1.1 reader on a trio socket (it decodes the
chunked body and the frames itself): httpx costs far more CPU per line than
the daemon spends per delivery, and on a small machine the clients share the
cores with the daemon, so a heavy client would measure itself.

Latency of one delivery = the wall clock when the subscriber parsed the
frame minus the event's ``recorded_at`` (the store's clock, read just before
the commit, on the same machine), so it covers the commit itself, the
fan-out, the HTTP write and the client's read. Only events recorded after
the subscribers connected are counted (the replayed head is not live).

Baseline, same run, same subscribers and readers: a bare hypercorn-on-trio
ASGI app (no salvor, no Quart, no store) that writes the same frames to every
stream: as many as the run delivered live, each of the run's mean frame size,
in one write per step of the run (the run's burst of four commits a step is
one write per stream at best), a write every 0.25 s so nothing queues: the
floor of the HTTP stack itself, and of the readers parsing those frames, for
this fan-out on this machine. (The readers share the cores with the server,
so a floor carrying fewer frames than the run would leave the server more CPU.)
Its collector is set as ``salvor serve`` sets its own (``settle_collector``):
at CPython's defaults the floor's own p99 is twice as long.

Targets: p99 <= 1.5x the floor's p99 (and, from before, p99 <= 50 ms). The floor this bench
measured before (one frame a step, a quarter of the run's frames) is printed beside it. Prints
one JSON object; never a timed assertion.

    python tests/bench/bench_sse.py [--subscribers 1000] [--client-processes 4]
    [--steps 20] [--dir DIR] [--store URL]

``--store postgresql://...`` runs the daemon on that server, in a schema of
its own dropped at the end (default: a fresh SQLite file in the scratch dir).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import trio

from tests.bench.bench_recover import ServeProcess, free_port, wait_for_port
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


class StreamReader:
    """One server-sent event stream over a plain socket: HTTP/1.1 head, chunked body, frames."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream, self.buffer, self.body = stream, b"", b""
        # Body chunks read: one per write the server made (hypercorn sends one chunk per
        # ASGI body message), so this counts the server's writes to this stream.
        self.chunks = 0

    @classmethod
    async def open(cls, base_url: str, path: str) -> StreamReader:
        host, port = base_url.split("://", 1)[1].rsplit(":", 1)
        reader = cls(await trio.open_tcp_stream(host, int(port)))
        await reader.stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        head = await reader._until(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            raise AssertionError(f"{path} answered {status}")
        return reader

    async def _fill(self, size: int) -> None:
        while len(self.buffer) < size:
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("the stream closed mid-frame")
            self.buffer += data

    async def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            await self._fill(len(self.buffer) + 1)
        piece, self.buffer = self.buffer.split(marker, 1)
        return piece

    async def frames(self) -> AsyncIterator[bytes]:
        """Each frame's text (without its blank line) until the body's last chunk."""
        while True:
            size = int((await self._until(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                return
            self.chunks += 1
            await self._fill(size + 2)
            self.body += self.buffer[:size]
            self.buffer = self.buffer[size + 2 :]
            *complete, self.body = self.body.split(b"\n\n")
            for frame in complete:
                yield frame


def _data(frame: bytes) -> bytes | None:
    for line in frame.split(b"\n"):
        if line.startswith(b"data: "):
            return line[6:]
    return None


def _subscriber_child(
    base_url: str, path: str, streams: int, live_from: int, ready, results
) -> None:
    """``streams`` subscribers of ``path``. With ``live_from`` >= 0 the frames are salvor's
    envelopes: each seq must arrive once, in order, and latency counts from ``recorded_at``
    for seqs from ``live_from`` on. With -1 they are the baseline's, stamped ``sent_at``."""

    async def subscribe_all() -> None:
        latencies: list[float] = []
        completed = frame_bytes = chunks = 0

        async def subscribe() -> None:
            nonlocal completed, frame_bytes, chunks
            expected = 0
            reader = await StreamReader.open(base_url, path)
            ready.put(1)
            async with reader.stream:
                async for frame in reader.frames():
                    data = _data(frame)
                    if data is None or frame.startswith(b"event: end"):
                        continue
                    now = time.time()
                    frame_bytes += len(frame) + 2
                    body = json.loads(data)
                    if live_from < 0:
                        latencies.append(now - body["sent_at"])
                        continue
                    if body["seq"] != expected:
                        raise AssertionError(f"seq {body['seq']} after {expected - 1}")
                    expected += 1
                    if body["seq"] >= live_from:
                        latencies.append(now - _epoch(body["recorded_at"]))
            completed += 1
            chunks += reader.chunks

        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(subscribe)
        results.put((latencies, completed, frame_bytes, chunks))

    trio.run(subscribe_all)


def _subscribe_all(
    base_url: str,
    path: str,
    subscribers: int,
    processes: int,
    live_from: int,
    go: Callable[[], None],
) -> tuple[list[float], int, float, int, float]:
    """Start the subscriber processes, call ``go`` once every stream is open.

    Returns the sorted latencies, the streams that ended cleanly, the seconds to connect them all,
    the mean size of a measured frame, and the mean body chunks (server writes) per stream.
    """
    ready, results = CONTEXT.Queue(), CONTEXT.Queue()
    shares = [subscribers // processes + (i < subscribers % processes) for i in range(processes)]
    clients = [
        CONTEXT.Process(
            target=_subscriber_child,
            args=(base_url, path, n, live_from, ready, results),
            daemon=True,
        )
        for n in shares
    ]
    began = time.perf_counter()
    for process in clients:
        process.start()
    for _ in range(subscribers):
        ready.get(timeout=120)
    connect_seconds = time.perf_counter() - began
    go()
    latencies: list[float] = []
    completed = frame_bytes = chunks = 0
    for _ in clients:
        got, ok, size, written = results.get(timeout=600)
        latencies.extend(got)
        completed += ok
        frame_bytes += size
        chunks += written
    for process in clients:
        process.join(timeout=30)
    latencies.sort()
    per_frame = frame_bytes // max(1, len(latencies))
    return latencies, completed, connect_seconds, per_frame, chunks / max(1, subscribers)


def _cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The CPU a server process spends between ``start`` (the clients are connected) and
    ``stop`` (every stream has ended)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.began, self.seconds = pid, 0.0, 0.0

    def start(self) -> None:
        self.began = _cpu_seconds(self.pid)

    def stop(self) -> float:
        self.seconds = _cpu_seconds(self.pid) - self.began
        return self.seconds


def _percentiles(latencies: list[float]) -> dict:
    def at(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1000, 2)

    return {
        "p50_ms": at(0.5),
        "p90_ms": at(0.9),
        "p99_ms": at(0.99),
        "max_ms": round(latencies[-1] * 1000, 2),
    }


# The HTTP stack's own floor: hypercorn on trio writing the same frames to every
# connected stream, one chunk of them per step; no routing, no store, no salvor.
_BARE_FAN_OUT = r"""
import json, sys, time, trio
from hypercorn.config import Config
from hypercorn.trio import serve
from salvor.daemon.serve import settle_collector
from salvor.daemon.web._asgi import answer_lifespan

subscribers, frames, pad = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
writes = int(sys.argv[5])
# The collector set as `salvor serve` sets it, so that the floor is the same interpreter's.
settle_collector()
channels = []
connected = trio.Event()


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    sender, receiver = trio.open_memory_channel(frames + 1)
    channels.append(sender)
    if len(channels) == subscribers:
        connected.set()
    async for frame in receiver:
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def broadcast():
    await connected.wait()
    await trio.sleep(0.5)
    for write in range(writes):
        sent_at = time.time()
        chunk = b"".join(
            f"id: {i}\ndata: {json.dumps({'i': i, 'sent_at': sent_at, 'pad': 'x' * pad})}\n\n"
            .encode()
            for i in range(write * frames // writes, (write + 1) * frames // writes)
        )
        for sender in channels:
            sender.send_nowait(chunk)
        await trio.sleep(0.25)
    for sender in channels:
        sender.close()


async def main():
    config = Config()
    config.bind = [sys.argv[1]]
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broadcast)
        await serve(app, config)


trio.run(main)
"""


def _bare_fan_out(
    subscribers: int, processes: int, frames: int, frame_bytes: int, writes: int
) -> tuple[list[float], int, float]:
    """The baseline's latencies, clean ends and server CPU seconds: ``frames`` constant frames
    of about ``frame_bytes``, in ``writes`` chunks to each stream."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _BARE_FAN_OUT,
            f"127.0.0.1:{port}",
            str(subscribers),
            str(frames),
            str(max(0, frame_bytes - 60)),
            str(writes),
        ]
    )
    try:
        wait_for_port(port)
        cpu = CpuMeter(server.pid)
        latencies, completed, _, _, _ = _subscribe_all(
            f"http://127.0.0.1:{port}", "/", subscribers, processes, -1, cpu.start
        )
        return latencies, completed, cpu.stop()
    finally:
        server.kill()
        server.wait()


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
    provider = CONTEXT.Process(
        target=_provider_child, args=(args.steps, args.step_delay, go, child_end), daemon=True
    )
    provider.start()
    provider_url = parent_end.recv()
    with (
        tempfile.TemporaryDirectory(dir=args.dir, prefix="salvor-bench-sse-") as scratch,
        bench_store_url(args.store, Path(scratch)) as url,
    ):
        scratch_path = Path(scratch)
        daemon = ServeProcess(
            url,
            scratch_path,
            "--demo-tools",
            "--model-endpoint",
            provider_url,
            # Every subscriber is on loopback: one client, past the default cap of open streams.
            "--max-streams-per-client",
            "0",
        )
        daemon.start()
        try:
            with httpx.Client(base_url=daemon.base_url, timeout=60) as client:
                agent_text = (
                    'model = "claude-sonnet-4-5"\nmax_response_tokens = 256\n'
                    f'[llm]\nprovider = "anthropic"\nbase_url = "{provider_url}"\nmax_retries = 0\n'
                    '[[tools]]\nname = "lookup_invoice"\n'
                )
                agent = (
                    client.post(
                        "/v1/agents",
                        content=agent_text,
                        headers={"content-type": "application/toml"},
                    )
                    .raise_for_status()
                    .json()["agent"]
                )
                run_id = (
                    client.post("/v1/runs", json={"agent": agent, "input": "look them up"})
                    .raise_for_status()
                    .json()["run"]
                )
                # The head and the first model intent are recorded before the provider lets go.
                while client.get(f"/v1/runs/{run_id}").json()["event_count"] < 2:
                    time.sleep(0.01)
                live_from = 2
                cpu = CpuMeter(daemon.proc.pid)

                def start() -> None:
                    cpu.start()
                    go.set()

                latencies, completed_streams, connect_seconds, frame_bytes, writes = _subscribe_all(
                    daemon.base_url,
                    f"/v1/runs/{run_id}/events",
                    args.subscribers,
                    args.client_processes,
                    live_from,
                    start,
                )
                cpu.stop()
                events = client.get(f"/v1/runs/{run_id}").json()["event_count"]
        finally:
            code = daemon.stop()
            parent_end.send("stop")
            provider.join(timeout=10)
    live_events = events - live_from
    bare, bare_completed, bare_cpu = _bare_fan_out(
        args.subscribers, args.client_processes, live_events, frame_bytes, args.steps
    )
    # The floor this bench had before: one frame a step (a quarter of the run's frames).
    one_frame, _, _ = _bare_fan_out(
        args.subscribers, args.client_processes, args.steps, frame_bytes, args.steps
    )
    salvor, floor, one_frame_floor = (
        _percentiles(latencies),
        _percentiles(bare),
        _percentiles(one_frame),
    )
    ratio = round(salvor["p99_ms"] / floor["p99_ms"], 2)
    print(
        json.dumps(
            {
                **({} if args.store is None else {"backend": "postgresql"}),
                "bench": "sse",
                "subscribers": args.subscribers,
                "client_processes": args.client_processes,
                "streams_completed": completed_streams,
                "events_in_run": events,
                "live_events_per_subscriber": live_events,
                "deliveries_measured": len(latencies),
                "connect_all_seconds": round(connect_seconds, 3),
                "latency_p50_ms": salvor["p50_ms"],
                "latency_p90_ms": salvor["p90_ms"],
                "latency_p99_ms": salvor["p99_ms"],
                "latency_max_ms": salvor["max_ms"],
                "frame_bytes_mean": frame_bytes,
                "server_writes_per_subscriber": round(writes, 1),
                "server_cpu_seconds_live": round(cpu.seconds, 2),
                "baseline_bare_hypercorn_same_frames_fan_out": {
                    **floor,
                    "frames": live_events,
                    "writes_per_subscriber": args.steps,
                    "server_cpu_seconds_live": round(bare_cpu, 2),
                    "streams_completed": bare_completed,
                },
                "baseline_bare_hypercorn_one_frame_per_step": {
                    **one_frame_floor,
                    "frames": args.steps,
                    "p99_vs_this_p99": round(salvor["p99_ms"] / one_frame_floor["p99_ms"], 2),
                },
                "p99_vs_bare_p99": ratio,
                "target_p99_vs_bare_p99": 1.5,
                "meets_target_vs_bare": ratio <= 1.5,
                "target_p99_ms": 50,
                "meets_target": salvor["p99_ms"] <= 50,
                "exit_code_after_sigterm": code,
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
