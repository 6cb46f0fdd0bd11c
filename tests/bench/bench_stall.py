"""Benchmark: a second client's ``/v1/health`` latency while one request's payload is in flight.

``salvor serve`` runs as a subprocess. A prober thread asks ``GET /v1/health`` back to back (a
short pause between asks) on its own connection, the whole time. First with nothing else in
flight (the floor), then while each attack payload of issue 29 is sent, one after another:

* ``markdown_7mib``: a markdown agent whose front matter is 7 MiB of small values (it stalled
  every request for 23 s);
* ``markdown_at_limit``: the same, just under the agent definition's 1 MiB bound (parsed whole);
* ``pattern``: a gate whose approval schema's ``pattern`` is ``^(a+)+$``, resumed with 26 a's and
  a b (a backtracking engine took 6 s at 25, doubling with each);
* ``enum_300k``: ``/v1/graphs/validate`` with a gate schema ``enum`` of 300,000 values (7 s);
* ``graph_20k``: ``/v1/graphs/validate`` with a JSON graph of 20,000 nodes (the node bound);
* ``yaml_events``: ``/v1/graphs/validate`` with a YAML document of a million small values;
* ``yaml_deep``: the same with sequences nested 100,000 deep.

For each, the latencies of the probes that overlapped the payload (started before its answer
came, ended after it was sent) and of those in the half second after: p50, p99 and max, the
payload's own status and seconds. Target: each p99 under 100 ms. Prints one JSON object; never
a timed assertion (``tests/daemon/api/test_stall.py`` holds a generous bound on the same
payloads).

    python tests/bench/bench_stall.py [--only NAME ...] [--dir DIR] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx

from tests.bench.bench_graph import large_document
from tests.bench.bench_recover import ServeProcess
from tests.bench.bench_store import add_store_option, bench_store_url

# How long the prober waits between two asks, and how long after a payload's answer its probes
# still count (a stall that outlives the answer is a stall all the same).
PROBE_PAUSE = 0.005
TAIL_SECONDS = 0.5
FLOOR_SECONDS = 2.0

Send = Callable[[httpx.Client], httpx.Response]


def markdown_agent(size: int) -> bytes:
    """A markdown agent of about ``size`` bytes, nearly all of it front matter of small values."""
    head = b"---\nname: big\nmodel: claude-sonnet-4-5\ncard: {"
    pairs = b", ".join(b"k%d: v" % i for i in range(size // 9))
    return head + pairs[: size - len(head) - 40].rsplit(b",", 1)[0] + b"}\n---\nYou answer.\n"


def gate_graph(schema: dict) -> dict:
    return {
        "schema_version": 1,
        "nodes": [
            {"id": "ask", "kind": "gate", "prompt": "Which code?", "approval_schema": schema}
        ],
        "edges": [],
    }


PATTERN_SCHEMA = {
    "type": "object",
    "required": ["code"],
    "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}},
}
PATTERN_ANSWER = {"code": "a" * 26 + "b"}


def parked_at_gate(client: httpx.Client) -> str:
    """A graph run parked at a gate whose schema holds the catastrophic pattern (set up before
    the probing starts: only the resume is the payload)."""
    submitted = client.post("/v1/graphs", json=gate_graph(PATTERN_SCHEMA))
    submitted.raise_for_status()
    started = client.post("/v1/graph-runs", json={"graph_hash": submitted.json()["graph"]})
    started.raise_for_status()
    run_id = started.json()["run"]
    deadline = time.monotonic() + 30
    while client.get(f"/v1/runs/{run_id}").json()["status"]["state"] != "suspended":
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} never reached its gate")
        time.sleep(0.05)
    return run_id


def _validate(body: bytes, content_type: str) -> Send:
    def send(client: httpx.Client) -> httpx.Response:
        return client.post(
            "/v1/graphs/validate", content=body, headers={"content-type": content_type}
        )

    return send


def _agent(size: int) -> Callable[[httpx.Client], Send]:
    def prepare(client: httpx.Client) -> Send:
        body = markdown_agent(size)
        return lambda c: c.post(
            "/v1/agents", content=body, headers={"content-type": "text/markdown"}
        )

    return prepare


def _pattern(client: httpx.Client) -> Send:
    run_id = parked_at_gate(client)
    return lambda c: c.post(f"/v1/runs/{run_id}/resume", json={"input": PATTERN_ANSWER})


def _enum(client: httpx.Client) -> Send:
    enum = gate_graph({"enum": [f"value-{i}" for i in range(300_000)]})
    return _validate(json.dumps(enum).encode(), "application/json")


def _graph(client: httpx.Client) -> Send:
    return _validate(json.dumps(large_document(20_000)).encode(), "application/json")


def _yaml_events(client: httpx.Client) -> Send:
    many = "x: [" + ", ".join("1" for _ in range(1_000_000)) + "]\n"
    return _validate(many.encode(), "application/yaml")


def _yaml_deep(client: httpx.Client) -> Send:
    deep = "x: " + "[" * 100_000 + "]" * 100_000 + "\n"
    return _validate(deep.encode(), "application/yaml")


# Each payload by name: a function that sets up what it needs on the daemon (before any probe
# counts) and returns the function that sends it.
PAYLOADS: dict[str, Callable[[httpx.Client], Send]] = {
    "markdown_7mib": _agent(7 * 1024 * 1024),
    "markdown_at_limit": _agent(1024 * 1024 - 1024),
    "pattern": _pattern,
    "enum_300k": _enum,
    "graph_20k": _graph,
    "yaml_events": _yaml_events,
    "yaml_deep": _yaml_deep,
}


class Prober:
    """Asks ``/v1/health`` back to back on a thread of its own; keeps (start, end) of each ask."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.asks: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=120) as client:
            while not self._stop.is_set():
                began = time.perf_counter()
                client.get("/v1/health").raise_for_status()
                self.asks.append((began, time.perf_counter()))
                time.sleep(PROBE_PAUSE)

    def latencies(self, start: float, end: float) -> list[float]:
        """Seconds of each ask that overlapped ``[start, end + TAIL_SECONDS]``, sorted."""
        return sorted(e - b for b, e in list(self.asks) if e >= start and b <= end + TAIL_SECONDS)


def under_payload(
    base_url: str, send: Callable[[httpx.Client], httpx.Response]
) -> tuple[list[float], httpx.Response, float]:
    """The health latencies while ``send`` is in flight, its response, and its seconds."""
    with Prober(base_url) as prober, httpx.Client(base_url=base_url, timeout=600) as client:
        time.sleep(0.2)  # the prober's connection is open and warm
        start = time.perf_counter()
        response = send(client)
        end = time.perf_counter()
        time.sleep(TAIL_SECONDS)
    return prober.latencies(start, end), response, end - start


def percentiles(latencies: list[float]) -> dict:
    def at(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1000, 2)

    return {"probes": len(latencies), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", nargs="*", default=None, help="payload names to send")
    parser.add_argument("--dir", type=Path, default=None)
    add_store_option(parser)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(dir=args.dir) as scratch,
        bench_store_url(args.store, Path(scratch)) as store_url,
    ):
        serve = ServeProcess(store_url, Path(scratch))
        serve.start()
        try:
            result = run(serve.base_url, args.only)
        finally:
            serve.stop()
    print(json.dumps(result))


def run(base_url: str, only: list[str] | None) -> dict:
    with Prober(base_url) as prober:
        start = time.perf_counter()
        time.sleep(FLOOR_SECONDS)
        floor = percentiles(prober.latencies(start, time.perf_counter() - TAIL_SECONDS))
    results = {}
    for name, prepare in PAYLOADS.items():
        if only and name not in only:
            continue
        with httpx.Client(base_url=base_url, timeout=120) as client:
            send = prepare(client)
        latencies, response, seconds = under_payload(base_url, send)
        results[name] = {
            **percentiles(latencies),
            "status": response.status_code,
            "payload_s": round(seconds, 3),
        }
    worst = max((r["p99_ms"] for r in results.values()), default=0.0)
    return {
        "bench": "stall",
        "floor": floor,
        "payloads": results,
        "worst_p99_ms": worst,
        "target_p99_ms": 100,
        "met": worst < 100,
    }


if __name__ == "__main__":
    main()
