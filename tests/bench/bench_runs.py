"""Benchmark: many concurrent runs through one daemon, events/s against raw batched sqlite3 inserts.

1,000 runs (``--runs``) of an agent that takes 10 steps (``--steps``: a model
call asking for ``lookup_invoice``, then the tool), plus the final answer,
are started over HTTP against one daemon: by default a real ``salvor serve``
process on a loopback port (``--workers N``, else ``salvor serve``'s own
default), over a fresh SQLite file with WAL and synchronous=FULL. The model
is the scripted provider in processes of its own (``--providers``, default
4); the runs are spread over one agent per provider process. The demo
tools' effect ledger (an fsync per tool call under one lock, kept for the
kill tests' counts) is off unless ``--tool-ledger``: it is the tool's cost,
which the model-call ceiling leaves out.

Measured: durable events per second from the first ``POST /v1/runs`` until
every run completed, and the writer's group commit: appends (one run's batch
each) against the transactions that committed them, from the daemon's
``/metrics`` counters summed over its workers (``serve_process``). Also the
CPU seconds per run of the daemon's processes, the provider processes and
this load client, so a figure says what bounds it on this machine.

``--in-process`` runs ``serve()`` in this process instead (one worker), the
group commit counted by wrapping ``EventStore.append_batch`` (production code
unchanged): it adds the largest group and the writer's busy fraction, lets
``--drive-concurrency`` differ from ``salvor serve``'s 64, and puts the daemon
in one interpreter to profile.

The baseline, on the same filesystem: raw ``sqlite3`` inserting
rows of a similar size, many rows per ``BEGIN IMMEDIATE ... COMMIT``, with the
same pragmas, at the group size salvor reached and at 256 rows. A second
baseline: the same number of model calls with no salvor at all (httpx
clients, as many as salvor drives at once: 64 per worker, against fresh
provider processes); times the events salvor records per call, it is the
ceiling the model round trip alone puts on events per second on this machine.

``--store postgresql://...`` runs the daemon on that server instead, in a
schema of its own dropped at the end, and the baseline becomes the same
database's own rate through psycopg: one INSERT + COMMIT per row, and rows
batched per transaction at salvor's group size and at 256.

Also printed: the mean seconds one group commit took, the group-commit window,
and the machine's load average before and after (the bench is meant to run
alone; a busy machine shows there).

Prints one JSON object; never a timed assertion (pytest does not collect it).

    python tests/bench/bench_runs.py [--runs 1000] [--steps 10] [--workers N]
    [--providers 4] [--in-process] [--tool-ledger] [--dir DIR] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import trio
from salvor.daemon.agents import Credentials
from salvor.daemon.recording._store_access import GROUP_WINDOW_SECONDS
from salvor.daemon.serve._serve import ServeConfig, serve
from salvor.daemon.tools._demo import EFFECTS_ENV
from salvor.protocol import EventKind
from salvor.store import AppendRequest, EventStore

from tests.bench.bench_steps import RAW_PAYLOAD
from tests.bench.bench_store import (
    add_store_option,
    bench_store_url,
    pg_settings,
    raw_pg_batched_rows_per_s,
    raw_pg_commits_per_s,
)
from tests.bench.providers import ProviderProcesses
from tests.bench.serve_process import (
    COMMIT_SECONDS,
    ServeProcess,
    scrape_all,
    summed,
    wait_completed,
)

TARGET_RATIO = 0.5
# Issue 30's figures: appends sharing a transaction at this concurrency, and events/s against
# the model-call ceiling (the latter with the default workers; this bench runs one process).
GROUP_TARGET = 15
CEILING_TARGET = 0.8


class GroupCommitCounter:
    """Wraps ``EventStore.append_batch``: transactions, appends, events,
    time inside, runs completed."""

    def __init__(self) -> None:
        self.transactions = 0
        self.appends = 0
        # Drives letting their runs go, in the same transactions (``OwnerRelease``).
        self.releases = 0
        self.events = 0
        self.seconds = 0.0
        self.completed = 0
        self.largest = 0
        self._lock = threading.Lock()
        self._real = EventStore.append_batch

    def install(self) -> None:
        counter = self

        def append_batch(store, requests):
            start = time.perf_counter()
            results = counter._real(store, requests)
            elapsed = time.perf_counter() - start
            appends = events = completed = 0
            for request in requests:
                appends += isinstance(request, AppendRequest)
            for result in results:
                if isinstance(result, tuple):
                    envelopes = result[0]
                    events += len(envelopes)
                    completed += envelopes[-1].event.KIND is EventKind.RUN_COMPLETED
            with counter._lock:
                counter.transactions += 1
                counter.appends += appends
                counter.releases += len(requests) - appends
                counter.events += events
                counter.completed += completed
                counter.seconds += elapsed
                counter.largest = max(counter.largest, appends)
            return results

        EventStore.append_batch = append_batch

    def uninstall(self) -> None:
        EventStore.append_batch = self._real


def raw_batched_rows_per_s(path: Path, rows: int, per_txn: int) -> float:
    """Raw sqlite3 inserts, ``per_txn`` rows per BEGIN IMMEDIATE/COMMIT, WAL + synchronous=FULL."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute(
        "CREATE TABLE raw (run_id TEXT, seq INTEGER, payload TEXT, PRIMARY KEY (run_id, seq))"
    )
    try:
        start = time.perf_counter()
        for first in range(0, rows, per_txn):
            connection.execute("BEGIN IMMEDIATE")
            connection.executemany(
                "INSERT INTO raw (run_id, seq, payload) VALUES (?, ?, ?)",
                [
                    (f"run-{n % 1000}", n, RAW_PAYLOAD)
                    for n in range(first, min(rows, first + per_txn))
                ],
            )
            connection.execute("COMMIT")
        return rows / (time.perf_counter() - start)
    finally:
        connection.close()


async def direct_model_calls(base_urls: list[str], calls: int, concurrency: int) -> float:
    """Model calls per second with no salvor at all: the ceiling the model round trip sets.

    ``concurrency`` workers (as many as salvor drives at once), each with an
    httpx client of its own as a drive has, post the same Anthropic request
    to the scripted providers one after another until ``calls`` are answered.
    """
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "system": "You look up invoices, one at a time.",
        "messages": [{"role": "user", "content": "batch 0"}],
        "tools": [
            {
                "name": "lookup_invoice",
                "description": "Look up an invoice.",
                "input_schema": {
                    "type": "object",
                    "properties": {"invoice_id": {"type": "string"}},
                },
            }
        ],
    }
    left = [calls]

    async def worker(base_url: str) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            while left[0] > 0:
                left[0] -= 1
                response = await client.post(
                    f"{base_url}/v1/messages",
                    json=body,
                    headers={"x-api-key": "bench", "anthropic-version": "2023-06-01"},
                )
                response.raise_for_status()
                response.json()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for index in range(concurrency):
            nursery.start_soon(worker, base_urls[index % len(base_urls)])
    return calls / (time.perf_counter() - start)


def agent_toml(base_url: str, index: int) -> str:
    return (
        f'name = "bench-runs-{index}"\nmodel = "claude-sonnet-4-5"\n'
        'system_prompt = "You look up invoices, one at a time."\nmax_response_tokens = 256\n'
        f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\nmax_retries = 0\n'
        '[[tools]]\nname = "lookup_invoice"\n'
    )


async def drive_load(base_url: str, args, base_urls: list[str], until_completed) -> dict:
    """Register one agent per provider, start ``args.runs`` runs over HTTP, and wait (with
    ``until_completed(started)``, which returns the seconds since) for every one to complete."""
    async with httpx.AsyncClient(
        base_url=base_url, timeout=60, limits=httpx.Limits(max_connections=64)
    ) as client:
        agents = []
        for index, provider_url in enumerate(base_urls):
            response = await client.post(
                "/v1/agents",
                content=agent_toml(provider_url, index),
                headers={"content-type": "application/toml"},
            )
            response.raise_for_status()
            agents.append(response.json()["agent"])
        start = time.perf_counter()
        post_latencies: list[float] = []

        # A bounded number of POSTs in flight: a long queue in the client's
        # pool costs this process CPU (the daemon's too, in-process), not the daemon's work.
        posting = trio.CapacityLimiter(32)

        async def post(i: int) -> None:
            async with posting:
                began = time.perf_counter()
                response = await client.post(
                    "/v1/runs",
                    json={"agent": agents[i % len(agents)], "input": {"task": f"batch {i}"}},
                )
                response.raise_for_status()
                post_latencies.append(time.perf_counter() - began)

        async with trio.open_nursery() as posters:
            for i in range(args.runs):
                posters.start_soon(post, i)
        created = time.perf_counter() - start
        wall = await until_completed(start)
        page = {"status": "completed", "limit": 1000}
        listed = (await client.get("/v1/runs", params=page)).json()
    post_latencies.sort()
    return {
        "wall": wall,
        "created_seconds": created,
        "post_p50_ms": post_latencies[len(post_latencies) // 2] * 1000,
        "post_p99_ms": post_latencies[int(len(post_latencies) * 0.99)] * 1000,
        "listed_completed": len(listed["runs"]),
    }


async def bench_in_process(
    url: str, args, base_urls: list[str], counter: GroupCommitCounter
) -> dict:
    """The daemon as ``serve()`` in this process (one worker), counted by ``counter``."""
    config = ServeConfig(
        port=0,
        store_url=url,
        demo_tools=True,
        wake_interval=0,
        recovery_concurrency=args.drive_concurrency,
        # The operator declares the scripted providers, as `--model-endpoint` would.
        credentials=Credentials.for_daemon(model_endpoints=base_urls),
    )

    async def until_completed(start: float) -> float:
        while counter.completed < args.runs:
            await trio.sleep(0.02)
        return time.perf_counter() - start

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, config)
        events_before = counter.events
        result = await drive_load(binds[0], args, base_urls, until_completed)
        nursery.cancel_scope.cancel(reason="benchmark done")
    return {
        **result,
        "events": counter.events - events_before,
        "transactions": counter.transactions,
        "appends": counter.appends,
        "commit_seconds": counter.seconds,
    }


async def bench_serve_process(daemon: ServeProcess, args, base_urls: list[str]) -> dict:
    """The daemon as a real ``salvor serve``, counted through every worker's ``/metrics``."""
    before = await scrape_all(daemon.base_url, daemon.workers)
    cpu_before = daemon.cpu_seconds(), os.times()

    async def until_completed(start: float) -> float:
        return await wait_completed(daemon.base_url, args.runs, start)

    result = await drive_load(daemon.base_url, args, base_urls, until_completed)
    cpu_after = daemon.cpu_seconds(), os.times()
    counts = summed(before, await scrape_all(daemon.base_url, daemon.workers))
    return {
        **result,
        "events": int(counts["salvor_appends_total"]),
        "transactions": int(counts["salvor_commits_total"]),
        "appends": int(counts["salvor_append_batches_total"]),
        "commit_seconds": counts[COMMIT_SECONDS],
        "salvor_cpu_seconds": cpu_after[0] - cpu_before[0],
        "client_cpu_seconds": _cpu(cpu_after[1]) - _cpu(cpu_before[1]),
    }


def _cpu(times: os.times_result) -> float:
    return times.user + times.system


def _measure(
    url: str, args, providers: ProviderProcesses, counter: GroupCommitCounter, scratch: Path
) -> tuple[dict, int, float]:
    """salvor's part: the daemon (in this process, or a ``salvor serve``) under the load, then
    stopped. Returns its result, the workers it served with and the providers' CPU seconds."""
    provider_cpu = -providers.cpu_seconds()
    daemon = None
    try:
        if args.in_process:
            counter.install()
            result = trio.run(bench_in_process, url, args, providers.base_urls, counter)
        else:
            daemon = ServeProcess(
                url,
                providers.base_urls,
                workers=args.workers,
                tool_ledger=args.tool_ledger,
                scratch=scratch,
            )
            result = trio.run(bench_serve_process, daemon, args, providers.base_urls)
        provider_cpu += providers.cpu_seconds()
    finally:
        counter.uninstall()
        if daemon is not None:
            daemon.stop()
    return result, 1 if daemon is None else daemon.workers, provider_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--providers", type=int, default=4, help="scripted provider processes")
    parser.add_argument(
        "--drive-concurrency",
        type=int,
        default=64,
        help="how many runs one daemon process drives at once (ServeConfig.recovery_concurrency; "
        "salvor serve's default is 64, so only --in-process may change it)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="salvor serve --workers N (default: none given, so salvor serve's own default)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="serve() in this process (one worker) instead of a salvor serve process: the "
        "group commit then counted by wrapping EventStore.append_batch (largest group, writer "
        "busy fraction), and one interpreter to profile",
    )
    parser.add_argument(
        "--tool-ledger",
        action="store_true",
        help="keep the demo tools' effect ledger (an fsync per tool call, under one lock)",
    )
    parser.add_argument("--dir", type=Path, default=None)
    add_store_option(parser)
    args = parser.parse_args()
    if args.in_process and args.workers is not None:
        parser.error("--workers needs a salvor serve process (drop --in-process)")
    if args.in_process and not args.tool_ledger:
        os.environ[EFFECTS_ENV] = ""

    plan = [("lookup_invoice", {"invoice_id": f"INV-{i}"}) for i in range(args.steps)]
    # The machine is measured, not assumed quiet: other work on it shows here.
    load_before = os.getloadavg()
    counter = GroupCommitCounter()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="salvor-bench-runs-") as scratch:
        scratch_path = Path(scratch)
        with bench_store_url(args.store, scratch_path) as url:
            with ProviderProcesses(plan, args.providers) as providers:
                try:
                    result, workers, provider_cpu = _measure(
                        url, args, providers, counter, scratch_path
                    )
                finally:
                    model_calls = providers.stop()
            # The same model traffic with no salvor, against fresh providers
            # (so the counts above stay salvor's own), as many calls at once as salvor drives.
            direct_concurrency = args.drive_concurrency * workers
            with ProviderProcesses(plan, args.providers) as direct:
                direct_cpu = -direct.cpu_seconds(), _cpu(os.times())
                direct_start = time.perf_counter()
                direct_rate = trio.run(
                    direct_model_calls, direct.base_urls, model_calls, direct_concurrency
                )
                direct_wall = time.perf_counter() - direct_start
                direct_cpu = (
                    direct_cpu[0] + direct.cpu_seconds(),
                    _cpu(os.times()) - direct_cpu[1],
                )
                direct.stop()
            events = result["events"]
            group = max(1, round(events / max(1, result["transactions"])))
            raw_rows = max(20_000, events)
            if args.store is None:
                raw_matched = raw_batched_rows_per_s(
                    scratch_path / "raw-matched.db", raw_rows, group
                )
                raw_256 = raw_batched_rows_per_s(scratch_path / "raw-256.db", raw_rows, 256)
            else:
                raw_single = raw_pg_commits_per_s(url, min(raw_rows, 5_000), RAW_PAYLOAD)
                raw_matched = raw_pg_batched_rows_per_s(url, raw_rows, group, RAW_PAYLOAD)
                raw_256 = raw_pg_batched_rows_per_s(url, raw_rows, 256, RAW_PAYLOAD)
                settings = pg_settings(url)
    events_per_s = events / result["wall"]
    load_after = os.getloadavg()
    transactions = max(1, result["transactions"])
    appends_per_transaction = result["appends"] / transactions
    in_process = (
        {
            "owner_releases": counter.releases,
            "largest_group": counter.largest,
            "writer_busy_fraction": round(counter.seconds / result["wall"], 3),
        }
        if args.in_process
        else {}
    )
    # Where the CPU went (a salvor serve process only: in-process, salvor and the client share
    # one interpreter): seconds per run, against what the model round trip alone costs.
    cpu = (
        {}
        if args.in_process
        else {
            "cpu_seconds_per_run": {
                "salvor": round(result["salvor_cpu_seconds"] / args.runs, 4),
                "providers": round(provider_cpu / args.runs, 4),
                "load_client": round(result["client_cpu_seconds"] / args.runs, 4),
                "direct_providers": round(direct_cpu[0] / args.runs, 4),
                "direct_client": round(direct_cpu[1] / args.runs, 4),
            },
            "cpu_busy_cores": {
                "salvor_run": round(
                    (result["salvor_cpu_seconds"] + provider_cpu + result["client_cpu_seconds"])
                    / result["wall"],
                    2,
                ),
                "direct_run": round(sum(direct_cpu) / direct_wall, 2),
            },
        }
    )
    ceiling_ratio = events_per_s / (direct_rate * events / model_calls)
    raw = "raw_sqlite" if args.store is None else "raw_postgres"
    backend = {} if args.store is None else {"backend": "postgresql"}
    print(
        json.dumps(
            {
                **backend,
                "bench": "runs",
                "runs": args.runs,
                "steps_per_run": args.steps,
                "provider_processes": args.providers,
                "daemon": "in-process serve()" if args.in_process else "salvor serve process",
                "workers": workers,
                "tool_ledger": args.tool_ledger,
                "drive_concurrency": args.drive_concurrency,
                "direct_concurrency": direct_concurrency,
                "model_calls": model_calls,
                "events": events,
                "wall_seconds": round(result["wall"], 3),
                "create_seconds": round(result["created_seconds"], 3),
                "post_runs_p50_ms": round(result["post_p50_ms"], 2),
                "post_runs_p99_ms": round(result["post_p99_ms"], 2),
                "events_per_s": round(events_per_s, 1),
                "group_commit": {
                    "transactions": result["transactions"],
                    "appends": result["appends"],
                    "appends_per_transaction": round(appends_per_transaction, 2),
                    "events_per_transaction": round(events / transactions, 2),
                    **in_process,
                    "commit_ms_mean": round(result["commit_seconds"] / transactions * 1000, 3),
                    "window_seconds": GROUP_WINDOW_SECONDS,
                    "target_appends_per_transaction": GROUP_TARGET,
                    "meets_group_target": appends_per_transaction >= GROUP_TARGET,
                },
                **(
                    {}
                    if args.store is None
                    else {"raw_postgres_commits_per_s_one_row": round(raw_single, 1)}
                ),
                f"{raw}_rows_per_s_at_salvor_group": round(raw_matched, 1),
                f"{raw}_group_rows": group,
                f"{raw}_rows_per_s_256_per_txn": round(raw_256, 1),
                "ratio_vs_raw_at_salvor_group": round(events_per_s / raw_matched, 3),
                "ratio_vs_raw_256": round(events_per_s / raw_256, 3),
                "target_ratio": TARGET_RATIO,
                "meets_target": events_per_s / raw_256 >= TARGET_RATIO,
                "baseline_direct_model_calls_per_s": round(direct_rate, 1),
                "events_per_model_call": round(events / model_calls, 2),
                # What the model round trip alone allows, with salvor costing nothing.
                "ceiling_events_per_s_from_model_calls": round(
                    direct_rate * events / model_calls, 1
                ),
                "ratio_vs_model_call_ceiling": round(ceiling_ratio, 3),
                "target_ratio_vs_model_call_ceiling": CEILING_TARGET,
                "meets_ceiling_target": ceiling_ratio >= CEILING_TARGET,
                "listed_completed_page": result["listed_completed"],
                **cpu,
                **({"synchronous": "FULL"} if args.store is None else {"postgres": settings}),
                "cpus": os.cpu_count(),
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in load_after],
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
