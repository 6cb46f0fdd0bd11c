"""Benchmark: one page of 100 runs from a store of 100,000 (``GET /v1/runs``).

The store (a fresh SQLite file, or with ``--store postgresql://...`` a schema
of its own on that server, dropped at the end) is filled through ``EventStore.append_batch``,
1,000 runs per transaction: 90% completed, 10% parked mid-run (an open model
call). ``salvor serve`` runs as a subprocess; this process times requests
over loopback HTTP (one keep-alive connection, sequential requests):

* ``first_page``: ``?limit=100``
* ``deep_page``: ``?limit=100&cursor=...`` about half-way down the listing
* ``status_filter``: ``?status=awaiting_model&limit=100`` (10% of the runs match)
* ``status_filter_deep``: the same, from a cursor half-way down

Target: p50 <= 50 ms for a page. Prints one JSON object; never a timed assertion.

    python tests/bench/bench_list.py [--runs 100000] [--requests 200] [--dir DIR] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
from salvor.protocol import EMPTY_VIEW, ModelCallRequested, RunCompleted, RunStarted
from salvor.store import AppendRequest, EventStore

from tests.bench.bench_recover import BULK, ServeProcess
from tests.bench.bench_store import add_store_option, bench_store_url

AGENT = "sha256:" + "a" * 64


def build_store(url: str, runs: int) -> float:
    began = time.perf_counter()
    with EventStore.open(url) as store:
        for first in range(0, runs, BULK):
            batch = []
            for n in range(first, min(runs, first + BULK)):
                tail = (
                    ModelCallRequested(request_hash="sha256:" + "0" * 64)
                    if n % 10 == 0
                    else RunCompleted(output="ok")
                )
                events = [
                    RunStarted(agent_def_hash=AGENT, input={"n": n}, labels={"shard": str(n % 7)}),
                    tail,
                ]
                batch.append(
                    AppendRequest(run_id=str(uuid.uuid4()), events=events, view=EMPTY_VIEW)
                )
            for result in store.append_batch(batch):
                if isinstance(result, Exception):
                    raise result
    return time.perf_counter() - began


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "p50_ms": round(ordered[len(ordered) // 2] * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def cursor_at(client: httpx.Client, depth: int, **params) -> str:
    """The cursor ``depth`` runs down the listing (walked with the largest pages)."""
    cursor = None
    walked = 0
    while walked < depth:
        query = {**params, "limit": min(1000, depth - walked)}
        if cursor:
            query["cursor"] = cursor
        body = client.get("/v1/runs", params=query).raise_for_status().json()
        walked += len(body["runs"])
        cursor = body["next_cursor"]
    return cursor


def timed(client: httpx.Client, params: dict, requests: int) -> dict:
    samples = []
    for _ in range(5):
        client.get("/v1/runs", params=params).raise_for_status()  # warm
    for _ in range(requests):
        began = time.perf_counter()
        body = client.get("/v1/runs", params=params).raise_for_status().json()
        samples.append(time.perf_counter() - began)
    assert len(body["runs"]) == 100, len(body["runs"])
    return percentiles(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=None)
    add_store_option(parser)
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory(dir=args.dir, prefix="salvor-bench-list-") as scratch,
        bench_store_url(args.store, Path(scratch)) as url,
    ):
        scratch_path = Path(scratch)
        build_seconds = build_store(url, args.runs)
        daemon = ServeProcess(url, scratch_path)
        daemon.start()
        try:
            with httpx.Client(base_url=daemon.base_url, timeout=60) as client:
                deep = cursor_at(client, args.runs // 2)
                deep_filtered = cursor_at(client, args.runs // 20, status="awaiting_model")
                results = {
                    "first_page": timed(client, {"limit": 100}, args.requests),
                    "deep_page": timed(client, {"limit": 100, "cursor": deep}, args.requests),
                    "status_filter": timed(
                        client, {"limit": 100, "status": "awaiting_model"}, args.requests
                    ),
                    "status_filter_deep": timed(
                        client,
                        {"limit": 100, "status": "awaiting_model", "cursor": deep_filtered},
                        args.requests,
                    ),
                }
        finally:
            code = daemon.stop()
    print(
        json.dumps(
            {
                **({} if args.store is None else {"backend": "postgresql"}),
                "bench": "list",
                "runs": args.runs,
                "page": 100,
                "requests_per_case": args.requests,
                "store_build_seconds": round(build_seconds, 2),
                **results,
                "target_p50_ms": 50,
                "meets_target": all(r["p50_ms"] <= 50 for r in results.values()),
                "exit_code_after_sigterm": code,
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
