"""Benchmark: durable agent steps per second, against the raw sqlite3 commit rate.

One run of N sequential ``lookup_invoice`` steps (default 1,000), driven
in-process under trio by the real runtime (Runtime -> drive -> AgentLoop ->
RunContext -> StoreAccess -> EventStore) against the scripted model provider
over real loopback HTTP, into a fresh SQLite file (WAL, synchronous=FULL).
In the same process, on the same filesystem, the baseline: raw ``sqlite3``
with the same pragmas, one ``BEGIN IMMEDIATE; INSERT; COMMIT`` per row.

Completions are committed together with the next intent, so each model call
and each tool call costs one commit (two events). To separate the durability
cost from the model round trip and the growing conversation, every
``StoreAccess.append`` is timed (the bench wraps the method; production code
is unchanged).

Prints one JSON object. Never a timed assertion (pytest does not collect this
file: its name does not start with ``test_``).

    python tests/bench/bench_steps.py [--steps 1000] [--raw-rows 2000] [--dir DIR] [--profile FILE]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.recording._store_access import open_store_access
from salvor.daemon.runs._runtime import Runtime
from salvor.daemon.tools._demo import demo_registry
from salvor.protocol import RunState

from tests.support.scripted_provider import ProviderCall, ScriptedProvider, tool_loop_script

TARGET_RATIO = 0.8
# About the size of a recorded step (an intent or a completion row) in this run.
RAW_PAYLOAD = json.dumps(
    {
        "tool": "lookup_invoice",
        "input": {"invoice_id": "INV-123"},
        "output": {
            "invoice_id": "INV-123",
            "amount_cents": 4567,
            "customer_email": "billing+inv-123@example.com",
            "status": "paid",
        },
        "request_hash": "sha256:" + "0" * 64,
        "pad": "x" * 40,
    },
    separators=(",", ":"),
)


def raw_connection(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute(
        "CREATE TABLE IF NOT EXISTS raw (run_id TEXT, seq INTEGER, payload "
        "TEXT, PRIMARY KEY (run_id, seq))"
    )
    return connection


def raw_commit(connection: sqlite3.Connection, seq: int) -> None:
    connection.execute("BEGIN IMMEDIATE")
    connection.execute(
        "INSERT INTO raw (run_id, seq, payload) VALUES (?, ?, ?)", ("raw", seq, RAW_PAYLOAD)
    )
    connection.execute("COMMIT")


def raw_sqlite_commits_per_s(path: Path, rows: int) -> float:
    """One BEGIN IMMEDIATE / INSERT / COMMIT per row, WAL + synchronous=FULL."""
    connection = raw_connection(path)
    try:
        start = time.perf_counter()
        for seq in range(rows):
            raw_commit(connection, seq)
        return rows / (time.perf_counter() - start)
    finally:
        connection.close()


def raw_paced_commit_seconds(path: Path, gaps: list[float]) -> list[float]:
    """One raw commit after each of ``gaps`` of idle time, timing the commits alone.

    A run's commits are not back to back: a model call or a tool sits between
    two of them, and on this machine a commit after a few idle milliseconds
    costs about twice one made straight after another. Replaying the run's own
    gaps gives the raw rate at the run's own pace.
    """
    connection = raw_connection(path)
    try:
        times = []
        for seq, gap in enumerate(gaps):
            time.sleep(min(gap, 0.05))
            start = time.perf_counter()
            raw_commit(connection, seq)
            times.append(time.perf_counter() - start)
        return times
    finally:
        connection.close()


class ForgetfulProvider(ScriptedProvider):
    """The scripted provider, counting calls without keeping them.

    The stock provider keeps every call's parsed body and neutral request, so
    over N steps of a growing conversation it holds O(N^2) objects, and the
    full garbage collections walking them land inside salvor's timings. This
    one keeps a count only (``--forget-provider-calls``).
    """

    served = 0

    def _record(self, wire, body, request, headers, peer=None) -> ProviderCall:
        index = self.served
        self.served += 1
        return ProviderCall(
            index=index, wire=wire, body=body, request=request, headers=headers, peer=peer
        )

    @property
    def call_count(self) -> int:
        return self.served


def _serve_in_child(plan, connection) -> None:
    # Kept-alive connections, as a real provider's: a connection per call
    # would bill salvor for TCP set-up no production call pays.
    with ForgetfulProvider(tool_loop_script(plan), keep_alive=True) as provider:
        connection.send(provider.base_url)
        connection.recv()  # until the parent says stop
        connection.send(provider.call_count)


class ProviderProcess:
    """The scripted provider in a process of its own, as a real provider is.

    In-process, the provider's request parsing competes with salvor's writer
    thread for the interpreter lock and its garbage lands in salvor's
    collections; neither is salvor's cost.
    """

    def __init__(self, plan) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve_in_child, args=(plan, child), daemon=True)

    def __enter__(self) -> Self:
        self._process.start()
        self.base_url = self._connection.recv()
        return self

    @property
    def pid(self) -> int:
        return self._process.pid

    def stop(self) -> int:
        self._connection.send("stop")
        count = self._connection.recv()
        self._process.join(timeout=30)
        return count

    def __exit__(self, *exc_info) -> None:
        if self._process.is_alive():
            self._process.kill()


class GcClock:
    """Time spent in the garbage collector, per generation, on any thread."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started: dict[int, float] = {}

    def __call__(self, phase: str, info: dict) -> None:
        import threading

        key = threading.get_ident()
        if phase == "start":
            self._started[key] = time.perf_counter()
        elif key in self._started:
            generation = info["generation"]
            self.collections[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started.pop(key)


def agent_toml(base_url: str) -> str:
    return f"""
name = "bench-steps"
model = "claude-sonnet-4-5"
system_prompt = "You look up invoices, one at a time."
max_response_tokens = 256

[llm]
provider = "anthropic"
base_url = "{base_url}"
max_retries = 0

[[tools]]
name = "lookup_invoice"
"""


async def run_steps(
    url: str, steps: int, forget_calls: bool, paired: Path | None, in_process: bool = False
) -> dict:
    plan = [("lookup_invoice", {"invoice_id": f"INV-{i}"}) for i in range(steps)]
    if in_process:
        provider_type = ForgetfulProvider if forget_calls else ScriptedProvider
        provider_context = provider_type(tool_loop_script(plan))
    else:
        provider_context = ProviderProcess(plan)
    with provider_context as provider:
        async with open_store_access(url) as access:
            # Time every append as the runtime sees it: queue -> writer thread
            # -> guard + rows + one transaction + fsync -> back on trio.
            append_times: list[float] = []
            real_append = access.append

            append_spans: list[tuple[float, float]] = []

            async def timed_append(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return await real_append(*args, **kwargs)
                finally:
                    append_times.append(time.perf_counter() - start)
                    append_spans.append((start, time.perf_counter()))

            access.append = timed_append
            # Count and time transactions as the writer thread issues them:
            # the difference to the append times is the thread hop.
            store_times: list[float] = []
            probe_times: list[float] = []
            real_batch = access.store.append_batch
            probe = raw_connection(paired) if paired is not None else None

            def counted_batch(requests):
                start = time.perf_counter()
                try:
                    return real_batch(requests)
                finally:
                    store_times.append(time.perf_counter() - start)
                    if probe is not None:
                        # Paired baseline: one raw commit right after each
                        # append, so both meet the same disk at the same time.
                        start = time.perf_counter()
                        raw_commit(probe, len(probe_times))
                        probe_times.append(time.perf_counter() - start)

            access.store.append_batch = counted_batch

            runtime = Runtime(access, demo_registry(None))
            agent = parse_definition(
                agent_toml(provider.base_url), "toml", known_tools=runtime.kit.registry.names()
            )
            start = time.perf_counter()
            run_id = await runtime.starts.start_run(agent, {"task": f"look up {steps} invoices"})
            view = await runtime.drive(run_id, agent=agent)
            wall = time.perf_counter() - start
            model_calls = provider.call_count if in_process else provider.stop()
            if probe is not None:
                probe.close()
    if view.state is not RunState.COMPLETED:
        raise SystemExit(
            f"bench_steps: the run ended {view.state.value}, not completed: {view.status()}"
        )
    return {
        "view": view,
        "wall": wall,
        "model_calls": model_calls,
        "append_times": append_times,
        "append_gaps": [b[0] - a[1] for a, b in itertools.pairwise(append_spans)],
        "store_times": store_times,
        "probe_times": probe_times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--raw-rows", type=int, default=2000)
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the scratch databases go (default: system temp)",
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="write cProfile stats of the run here"
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="also time one raw commit right after every append (same disk, same moment); "
        "the probes' time is taken out of wall_seconds and append times",
    )
    parser.add_argument(
        "--provider-in-process",
        action="store_true",
        help=(
            "run the scripted provider on a thread of this process instead of a process of its own"
        ),
    )
    parser.add_argument(
        "--forget-provider-calls",
        action="store_true",
        help=(
            "count the provider's calls without keeping them (keeps "
            "the test double's heap out of GC)"
        ),
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="salvor-bench-") as scratch:
        scratch_path = Path(scratch)
        # Baseline before and after the run, on the same filesystem; the
        # better of the two is the bar (the ratio is then conservative).
        raw_rounds = [raw_sqlite_commits_per_s(scratch_path / "raw-0.db", args.raw_rows)]
        url = "sqlite:///" + str(scratch_path / "salvor.db")
        paired = scratch_path / "raw-paired.db" if args.paired else None
        gc_clock = GcClock()
        gc.callbacks.append(gc_clock)
        if args.profile is not None:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
            result = trio.run(
                run_steps,
                url,
                args.steps,
                args.forget_provider_calls,
                paired,
                args.provider_in_process,
            )
            profiler.disable()
            profiler.dump_stats(args.profile)
        else:
            result = trio.run(
                run_steps,
                url,
                args.steps,
                args.forget_provider_calls,
                paired,
                args.provider_in_process,
            )
        gc.callbacks.remove(gc_clock)
        raw_rounds.append(raw_sqlite_commits_per_s(scratch_path / "raw-1.db", args.raw_rows))
        paced = raw_paced_commit_seconds(scratch_path / "raw-paced.db", result["append_gaps"])
        filesystem = os.statvfs(scratch)

    view = result["view"]
    probes = result["probe_times"]
    # Probes run inside the writer thread, so they sit inside wall and append times.
    wall = result["wall"] - sum(probes)
    append_times = result["append_times"]
    if probes:
        # One run appends one batch at a time: probe i sits inside append i.
        append_times = [t - p for t, p in zip(append_times, probes)] + append_times[len(probes) :]
    commits = len(append_times)
    append_total = sum(append_times)
    raw = max(raw_rounds)
    durable_per_s = commits / wall
    append_per_s = commits / append_total
    model_calls = result["model_calls"]
    append_sorted = sorted(append_times)
    print(
        json.dumps(
            {
                "bench": "steps",
                "steps": args.steps,
                "model_calls": model_calls,
                "commits": commits,
                "transactions": len(result["store_times"]),
                "events": view.next_seq,
                "wall_seconds": round(wall, 3),
                "agent_steps_per_s": round(args.steps / wall, 1),
                "durable_transitions_per_s": round(durable_per_s, 1),
                "raw_sqlite_commits_per_s": round(raw, 1),
                "raw_sqlite_rounds": [round(r, 1) for r in raw_rounds],
                "ratio_end_to_end": round(durable_per_s / raw, 3),
                "append_seconds_total": round(append_total, 3),
                "append_commits_per_s": round(append_per_s, 1),
                "append_p50_ms": round(append_sorted[len(append_sorted) // 2] * 1000, 3),
                "append_p99_ms": round(append_sorted[int(len(append_sorted) * 0.99)] * 1000, 3),
                "ratio_appends": round(append_per_s / raw, 3),
                # The same raw commit, made at the run's own pace (the idle
                # gaps between its appends replayed): the per-step comparison.
                "raw_paced_commits_per_s": round(len(paced) / sum(paced), 1),
                "ratio_appends_paced": round(append_per_s / (len(paced) / sum(paced)), 3),
                # Inside the writer thread (guard, rows, SQL, commit, fsync),
                # and what the hop to and from it adds per append.
                "store_seconds_total": round(sum(result["store_times"]), 3),
                "store_commits_per_s": round(
                    len(result["store_times"]) / sum(result["store_times"]), 1
                ),
                "hop_overhead_ms_per_append": round(
                    (append_total - sum(result["store_times"])) / commits * 1000, 3
                ),
                **(
                    {
                        "paired_raw_commits_per_s": round(len(probes) / sum(probes), 1),
                        "ratio_appends_paired": round(
                            append_per_s / (len(probes) / sum(probes)), 3
                        ),
                    }
                    if probes
                    else {}
                ),
                "gc_seconds_by_generation": [round(t, 3) for t in gc_clock.seconds],
                "gc_collections_by_generation": gc_clock.collections,
                "provider": "thread" if args.provider_in_process else "process",
                "provider_keeps_calls": args.provider_in_process and not args.forget_provider_calls,
                "target_ratio": TARGET_RATIO,
                "meets_target_paced": append_per_s / (len(paced) / sum(paced)) >= 0.8,
                "meets_target": append_per_s / raw >= TARGET_RATIO,
                "synchronous": "FULL",
                "filesystem_block_size": filesystem.f_bsize,
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
