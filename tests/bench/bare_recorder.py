"""The bare recorder: the least any durable recorder of ``bench_runs``' runs does, no salvor code.

``bench_runs`` holds salvor to a fraction of the model-call ceiling: plain httpx clients
calling the scripted providers, recording nothing. On a small machine the daemon, the
providers and the load client share the same cores, so part of the distance to the ceiling
is not salvor's: it is what recording runs over HTTP costs at all. This measures that part,
beside salvor's rounds, by doing only what a recorder of these runs cannot skip:

* a run is started by ``POST /v1/runs`` (one per run, from the same load client, the same 32
  in flight), answered ``201`` once its head row is committed;
* each step's model call is recorded before it is made and its reply after, each tool call
  likewise, and the run's end: the same 4 rows a model call as salvor's log, in the same
  number of model calls (the same conversation and bytes as the ceiling's clients);
* every row is durable before what follows it happens: a thread per process commits every
  batch queued while the last committed in one transaction (group commit, as salvor's writer),
  on one SQLite file with WAL and ``synchronous=FULL``;
* as many processes as salvor's workers, each driving 64 runs at once with a kept httpx client
  each, dialling the providers inside the round as a fresh salvor serve does.

It skips all the rest, and each shortcut makes it cheaper than any real recorder, so its
ratio is an upper bound of what recording these runs over HTTP allows on the machine: raw
``sqlite3`` instead of SQLAlchemy Core; a bare ASGI callable on hypercorn instead of a web
framework; rows of the model's reply as text, never parsed back, checked, hashed or folded;
no registered agents, leases, streams, metrics, recovery or validation of anything; the load
spread evenly over one port per process instead of one shared listening socket.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Self

import httpx
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from tests.bench.model_call_ceiling import HEADERS, REQUEST, tool_results
from tests.bench.providers import ProviderProcesses
from tests.bench.serve_process import cpu_seconds

DRIVES_PER_PROCESS = 64
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS events "
    "(run_id TEXT, seq INTEGER, kind TEXT, body TEXT, PRIMARY KEY (run_id, seq))"
)
INSERT = "INSERT INTO events (run_id, seq, kind, body) VALUES (?, ?, ?, ?)"


class GroupWriter:
    """A thread committing rows to ``path``: what was queued while the last transaction
    committed goes in the next one, and each ``append`` returns once its rows are durable."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._token = trio.lowlevel.current_trio_token()
        self.transactions = 0
        self.appends = 0
        self._thread = threading.Thread(target=self._commit_loop, daemon=True)
        self._thread.start()

    async def append(self, rows: list[tuple]) -> None:
        done = trio.Event()
        self._queue.put((rows, done))
        await done.wait()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _commit_loop(self) -> None:
        connection = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = FULL")
        connection.execute("PRAGMA busy_timeout = 60000")
        while (first := self._queue.get()) is not None:
            batch = [first]
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            connection.execute("BEGIN IMMEDIATE")
            connection.executemany(INSERT, [row for rows, _ in batch for row in rows])
            connection.execute("COMMIT")
            self.transactions += 1
            self.appends += len(batch)
            self._token.run_sync_soon(_set_all, [done for _, done in batch])
        connection.close()


def _set_all(events: list[trio.Event]) -> None:
    for event in events:
        event.set()


class _Run:
    """One run's log: its id and the next seq."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.seq = 0

    def rows(self, *events: tuple[str, object]) -> list[tuple]:
        rows = []
        for kind, body in events:
            self.seq += 1
            rows.append((self.run_id, self.seq, kind, json.dumps(body)))
        return rows


async def _drive(run: _Run, task: dict, provider: str, clients, writer, completed) -> None:
    """A bench run's conversation with ``provider``, each row committed before what follows."""
    client = clients.pop()  # one free for each drive the limiter lets in
    try:
        messages: list = [{"role": "user", "content": json.dumps(task)}]
        while True:
            body = {**REQUEST, "messages": messages}
            await writer.append(run.rows(("ModelCallStarted", {"messages": messages[-1:]})))
            response = await client.post(f"{provider}/v1/messages", json=body, headers=HEADERS)
            response.raise_for_status()
            content = response.json()["content"]
            answers = tool_results(content)
            if not answers:
                await writer.append(
                    run.rows(("ModelCallCompleted", content), ("RunCompleted", content))
                )
                break
            uses = [block for block in content if block.get("type") == "tool_use"]
            await writer.append(
                run.rows(("ModelCallCompleted", content), ("ToolCallStarted", uses))
            )
            await writer.append(run.rows(("ToolCallCompleted", answers)))
            messages = [
                *messages,
                {"role": "assistant", "content": content},
                {"role": "user", "content": answers},
            ]
        completed[0] += 1
    finally:
        clients.append(client)


async def _read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _respond(send, status: int, payload: object) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _serve(path: Path, providers: list[str], pipe) -> None:
    writer = GroupWriter(path)
    completed = [0]
    drives = trio.CapacityLimiter(DRIVES_PER_PROCESS)
    clients: list[httpx.AsyncClient] = []
    async with trio.open_nursery() as nursery:

        async def drive(run: _Run, task: dict, provider: str) -> None:
            async with drives:
                await _drive(run, task, provider, clients, writer, completed)

        async def app(scope, receive, send) -> None:
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
                return
            if scope["method"] == "POST" and scope["path"] == "/v1/runs":
                started = json.loads(await _read_body(receive))
                run = _Run(uuid.uuid4().hex)
                await writer.append(run.rows(("RunStarted", started)))
                provider = providers[started["agent"] % len(providers)]
                nursery.start_soon(drive, run, started["input"], provider)
                await _respond(send, 201, {"run": run.run_id})
            else:
                await _respond(send, 200, {"completed": completed[0]})

        # Made before the clock starts (each makes a TLS context, which salvor's share), but
        # not connected: a fresh salvor serve dials its providers inside its round too.
        clients.extend(httpx.AsyncClient(timeout=60) for _ in range(DRIVES_PER_PROCESS))
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = config.errorlog = None
        stopped = trio.Event()
        binds = await nursery.start(
            lambda **status: serve(app, config, shutdown_trigger=stopped.wait, **status)
        )
        pipe.send(binds[0])
        await trio.to_thread.run_sync(pipe.recv, abandon_on_cancel=True)
        stopped.set()
    writer.close()
    pipe.send((writer.appends, writer.transactions))


def _child(path: Path, providers: list[str], pipe) -> None:
    trio.run(_serve, path, providers, pipe)


class BareRecorders:
    """``processes`` bare recorders over one SQLite file, for a with block: their base URLs,
    CPU seconds, and on ``stop`` their appends and transactions."""

    def __init__(self, path: Path, providers: list[str], processes: int) -> None:
        with sqlite3.connect(path) as connection:
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute(SCHEMA)
        context = multiprocessing.get_context("fork")
        self._children = []
        for _ in range(processes):
            mine, theirs = context.Pipe()
            child = context.Process(target=_child, args=(path, providers, theirs), daemon=True)
            self._children.append((child, mine))
        self.base_urls: list[str] = []

    def __enter__(self) -> Self:
        for child, pipe in self._children:
            child.start()
        self.base_urls = [pipe.recv() for _, pipe in self._children]
        return self

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(child.pid) for child, _ in self._children)

    def stop(self) -> tuple[int, int]:
        """Stop every recorder; their appends and transactions together."""
        for _, pipe in self._children:
            pipe.send("stop")
        counts = [pipe.recv() for _, pipe in self._children]
        for child, _ in self._children:
            child.join(timeout=30)
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def __exit__(self, *exc_info) -> None:
        for child, _ in self._children:
            if child.is_alive():
                child.kill()


async def _load(base_urls: list[str], runs: int, providers: int) -> float:
    """Start ``runs`` runs as ``bench_runs``' load client does (32 POSTs in flight), spread
    evenly over the recorders, and wait for all to complete: the seconds it took."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as client:
        start = time.perf_counter()
        posting = trio.CapacityLimiter(32)

        async def post(i: int) -> None:
            async with posting:
                body = {"agent": i % providers, "input": {"task": f"batch {i}"}}
                response = await client.post(f"{base_urls[i % len(base_urls)]}/v1/runs", json=body)
                response.raise_for_status()

        async with trio.open_nursery() as posters:
            for i in range(runs):
                posters.start_soon(post, i)
        while True:
            completed = 0
            for base_url in base_urls:
                completed += (await client.get(f"{base_url}/completed")).json()["completed"]
            if completed >= runs:
                return time.perf_counter() - start
            await trio.sleep(0.05)


def bare_round(plan, runs: int, providers: int, processes: int, scratch: Path) -> dict:
    """One round of the bare recorders under ``bench_runs``' load, on fresh providers and a
    fresh SQLite file: what ``bench_runs`` reports of a salvor round, from the same counts."""
    with (
        ProviderProcesses(plan, providers) as provider_processes,
        BareRecorders(scratch / "bare.db", provider_processes.base_urls, processes) as recorders,
    ):
        cpu_before = recorders.cpu_seconds(), provider_processes.cpu_seconds(), os.times()
        wall = trio.run(_load, recorders.base_urls, runs, providers)
        cpu_after = recorders.cpu_seconds(), provider_processes.cpu_seconds(), os.times()
        appends, transactions = recorders.stop()
        answered = provider_processes.stop()
    with sqlite3.connect(scratch / "bare.db") as connection:
        (events,) = connection.execute("SELECT count(*) FROM events").fetchone()
    # The same work as salvor's round, or the figure means nothing: every run's model calls
    # and 4 rows a call.
    calls = runs * (len(plan) + 1)
    if answered != calls or events != 4 * calls:
        raise RuntimeError(
            f"the bare recorders made {answered} model calls and {events} rows, "
            f"not {calls} and {4 * calls}"
        )
    return {
        "events": events,
        "wall": wall,
        "appends": appends,
        "transactions": transactions,
        "recorder_cpu_seconds": cpu_after[0] - cpu_before[0],
        "provider_cpu_seconds": cpu_after[1] - cpu_before[1],
        "client_cpu_seconds": _cpu(cpu_after[2]) - _cpu(cpu_before[2]),
    }


def _cpu(times: os.times_result) -> float:
    return times.user + times.system
