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

Measured, per round: durable events per second from the first ``POST /v1/runs`` until
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
same pragmas, at the group size salvor reached and at 256 rows.

The model-call ceiling: the model calls per second plain httpx clients get from the same
scripted providers on the same machine, no salvor at all (``model_call_ceiling``); times the
events salvor records per call, it is the rate the model round trip alone allows. It is
measured as short samples interleaved with salvor's rounds: ceiling, salvor, ceiling, ...,
ceiling (``--rounds`` salvor rounds, default 3, each on a fresh store, daemon and providers).
The figure is the median of salvor's rounds over the median of the samples; each round's
ratio against the samples just before and after it is printed too, with every sample, so the
spread shows. Why (last stop): one ceiling measured after salvor's one round moved 20% between
consecutive runs of the bench on this shared machine, and the ratio with it, while salvor's
own rate did not; a sample taken beside each round sees the same machine the round saw.
A sample's clients are as salvor's: one process per salvor worker (``--ceiling-processes``),
64 clients each, made and connected before the timed calls, as salvor keeps its clients
between drives. One process of 128 clients, as before, is bound by its own core (a
millisecond of CPU per call) and so measured that process rather than the model round trip.

The bare recorder (``bare_recorder``): after each salvor round, a round of the least any
durable recorder of these runs does (each row committed before what follows it, group commit,
runs started over HTTP by the same load client, one process per salvor worker) and nothing
else, no salvor code. Its ratio to the same ceiling samples is the most any recorder of these
runs reaches on this machine, and salvor's rate is printed against it (``--no-bare`` skips it;
on SQLite only).

``--store postgresql://...`` runs the daemon on that server instead, in a
schema of its own dropped at the end, and the baseline becomes the same
database's own rate through psycopg: one INSERT + COMMIT per row, and rows
batched per transaction at salvor's group size and at 256.

Also printed: the mean seconds one group commit took, the group-commit window,
and the machine's load average before and after (the bench is meant to run
alone; a busy machine shows there).

Prints one JSON object; never a timed assertion (pytest does not collect it).

    python tests/bench/bench_runs.py [--runs 1000] [--steps 10] [--workers N]
    [--rounds 3] [--ceiling-calls N] [--ceiling-processes N]
    [--providers 4] [--in-process] [--tool-ledger] [--dir DIR] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import trio
from salvor.daemon.agents import Credentials
from salvor.daemon.cli._arguments import cores
from salvor.daemon.serve._serve import ServeConfig, serve
from salvor.daemon.tools._demo import EFFECTS_ENV
from salvor.protocol import EventKind
from salvor.store import AppendRequest, EventStore

from tests.bench.bare_recorder import bare_round
from tests.bench.bench_steps import RAW_PAYLOAD
from tests.bench.bench_store import (
    add_store_option,
    bench_store_url,
    pg_settings,
    raw_pg_batched_rows_per_s,
    raw_pg_commits_per_s,
)
from tests.bench.model_call_ceiling import sample as ceiling_sample
from tests.bench.providers import ProviderProcesses
from tests.bench.runs_report import bare_report, report
from tests.bench.serve_process import (
    COMMIT_SECONDS,
    ServeProcess,
    scrape_all,
    summed,
    wait_completed,
)


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


def salvor_round(args, plan, scratch: Path) -> dict:
    """One round of salvor under the load: a fresh store, fresh providers and a fresh daemon (in
    this process, or a ``salvor serve``), stopped at the end. Its result, with the workers it
    served with, the model calls it made and the providers' CPU seconds."""
    counter = GroupCommitCounter()
    daemon = None
    with (
        bench_store_url(args.store, scratch) as url,
        ProviderProcesses(plan, args.providers) as providers,
    ):
        provider_cpu = -providers.cpu_seconds()
        try:
            if args.in_process:
                counter.install()
                result = trio.run(bench_in_process, url, args, providers.base_urls, counter)
                result.update(owner_releases=counter.releases, largest_group=counter.largest)
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
            model_calls = providers.stop()
    result.update(
        workers=1 if daemon is None else daemon.workers,
        model_calls=model_calls,
        provider_cpu_seconds=provider_cpu,
    )
    return result


def raw_baselines(args, scratch: Path, rows: int, group: int) -> dict:
    """The store's own rate without salvor, at salvor's group size and at 256 rows."""
    if args.store is None:
        return {
            "raw_sqlite_rows_per_s_at_salvor_group": round(
                raw_batched_rows_per_s(scratch / "raw-matched.db", rows, group), 1
            ),
            "raw_sqlite_group_rows": group,
            "raw_sqlite_rows_per_s_256_per_txn": round(
                raw_batched_rows_per_s(scratch / "raw-256.db", rows, 256), 1
            ),
        }
    with bench_store_url(args.store, scratch) as url:
        return {
            "raw_postgres_commits_per_s_one_row": round(
                raw_pg_commits_per_s(url, min(rows, 5_000), RAW_PAYLOAD), 1
            ),
            "raw_postgres_rows_per_s_at_salvor_group": round(
                raw_pg_batched_rows_per_s(url, rows, group, RAW_PAYLOAD), 1
            ),
            "raw_postgres_group_rows": group,
            "raw_postgres_rows_per_s_256_per_txn": round(
                raw_pg_batched_rows_per_s(url, rows, 256, RAW_PAYLOAD), 1
            ),
            "postgres": pg_settings(url),
        }


def parse_args() -> argparse.Namespace:
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
        "--rounds", type=int, default=3, help="salvor rounds, each between two ceiling samples"
    )
    parser.add_argument(
        "--ceiling-calls",
        type=int,
        default=None,
        help="model calls per ceiling sample (default: a quarter of a round's)",
    )
    parser.add_argument(
        "--ceiling-processes",
        type=int,
        default=None,
        help="client processes of a ceiling sample (default: as many as salvor's workers)",
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
    parser.add_argument(
        "--no-bare",
        action="store_true",
        help="skip the bare recorder's rounds (bare_recorder: the least any recorder of these "
        "runs does, measured after each salvor round)",
    )
    parser.add_argument("--dir", type=Path, default=None)
    add_store_option(parser)
    args = parser.parse_args()
    if args.in_process and args.workers is not None:
        parser.error("--workers needs a salvor serve process (drop --in-process)")
    if args.rounds < 1:
        parser.error("--rounds takes at least 1")
    return args


def main() -> None:
    args = parse_args()
    if args.in_process and not args.tool_ledger:
        os.environ[EFFECTS_ENV] = ""
    plan = [("lookup_invoice", {"invoice_id": f"INV-{i}"}) for i in range(args.steps)]
    # The client processes of a ceiling sample, one per salvor worker: known before the first
    # round only by what salvor serve decides, so checked against it after that round.
    workers = 1 if args.in_process else args.workers or cores()
    processes = args.ceiling_processes or workers
    ceiling_calls = args.ceiling_calls or max(1_000, args.runs * (args.steps + 1) // 4)

    def ceiling() -> dict:
        return ceiling_sample(
            plan, args.providers, ceiling_calls, processes, args.drive_concurrency
        )

    # The machine is measured, not assumed quiet: other work on it shows here.
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="salvor-bench-runs-") as scratch:
        ceilings, rounds, bare = [ceiling()], [], []
        for index in range(args.rounds):
            folder = Path(scratch) / f"round-{index}"
            folder.mkdir()
            rounds.append(salvor_round(args, plan, folder))
            if rounds[-1]["workers"] != workers and args.ceiling_processes is None:
                raise SystemExit(
                    f"salvor serve ran {rounds[-1]['workers']} workers, not the {workers} the "
                    "ceiling assumed: give --workers"
                )
            if not args.no_bare and args.store is None:
                bare.append(bare_round(plan, args.runs, args.providers, workers, folder))
            ceilings.append(ceiling())
        events = statistics.median(r["events"] for r in rounds)
        transactions = sum(r["transactions"] for r in rounds)
        group = max(1, round(sum(r["events"] for r in rounds) / max(1, transactions)))
        baselines = raw_baselines(args, Path(scratch), max(20_000, int(events)), group)
    clients = {
        "processes": processes,
        "clients_per_process": args.drive_concurrency,
        "calls_per_sample": ceiling_calls,
    }
    loads = load_before, os.getloadavg()
    result = report(args, rounds, ceilings, clients, baselines, loads)
    if bare:
        result["bare_recorder"] = bare_report(args.runs, bare, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
