"""A real ``salvor serve`` (``--workers N`` or its default) for a benchmark, and what it costs.

The daemon runs as an operator starts it: its own processes, the supervisor's listening address
shared by its workers. What it did is read from its ``/metrics``, per worker: the kernel hands
each new connection to whichever worker accepts it first, so a scrape answers for one worker
(its ``worker`` label says which) and ``Scrapes`` asks on fresh connections until every worker
has answered since the moment asked about (a worker holding two connections more than another
leaves new ones to it: ask while the load's own connections are closed). CPU seconds come from
``/proc`` (the supervisor and each worker, user + system), so a figure can say what salvor cost
against the provider processes and the load client.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

# The counters a run of the bench is judged by, summed over the workers: events, appends (one
# run's batch each) and the transactions that committed them.
COUNTERS = ("salvor_appends_total", "salvor_append_batches_total", "salvor_commits_total")
COMMIT_SECONDS = "salvor_commit_seconds_sum"
START_SECONDS = 60
SCRAPE_TRIES = 200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime are the 14th and 15th fields of the whole line (after pid and comm).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServeProcess:
    """``salvor serve`` on a free loopback port over ``store_url``, until ``stop``."""

    def __init__(
        self,
        store_url: str,
        model_endpoints: list[str],
        *,
        workers: int | None,
        tool_ledger: bool,
        scratch: Path,
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "salvor.daemon.cli", "serve", "--json"]
        args += ["--listen", f"127.0.0.1:{self.port}", "--store", store_url]
        args += ["--demo-tools", "--wake-interval", "0"]
        for endpoint in model_endpoints:
            args += ["--model-endpoint", endpoint]
        if workers is not None:
            args += ["--workers", str(workers)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SALVOR_", "NOTIFY_"))}
        if not tool_ledger:
            # The demo tools' effect ledger (for the kill tests' counts) fsyncs every tool call
            # under one lock: the tool's own cost, which the model-call ceiling leaves out.
            env["SALVOR_DEMO_EFFECTS"] = ""
        self._log = open(scratch / "serve.log", "wb")  # noqa: SIM115 -- closed in stop
        self._proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=self._log, start_new_session=True
        )
        line = self._proc.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError(f"salvor serve did not start; its log is {scratch / 'serve.log'}")
        ready = json.loads(line)
        self.pids = [self._proc.pid, *ready.get("workers", [])]
        self.workers = max(1, len(ready.get("workers", [])))

    def cpu_seconds(self) -> float:
        """The service's CPU seconds so far: the supervisor's and every worker's."""
        return sum(cpu_seconds(pid) for pid in self.pids)

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._log.close()


def parse(text: str) -> tuple[str, dict[str, float], float | None]:
    """One scrape: the worker that answered, the bench's counters and the completed runs."""
    worker = "0"
    counters: dict[str, float] = {}
    completed = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            worker = sample.labels.get("worker", worker)
            if sample.name in COUNTERS or sample.name == COMMIT_SECONDS:
                counters[sample.name] = sample.value
            elif sample.name == "salvor_runs" and sample.labels.get("state") == "completed":
                completed = sample.value
    return worker, counters, completed


async def scrape_one(base_url: str) -> tuple[str, dict[str, float], float | None]:
    # A fresh connection per scrape, so the kernel may hand it to any worker.
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        response = await client.get("/metrics")
        response.raise_for_status()
        return parse(response.text)


async def scrape_all(base_url: str, workers: int) -> dict[str, dict[str, float]]:
    """Every worker's counters, each read after this call began."""
    seen: dict[str, dict[str, float]] = {}
    for _ in range(SCRAPE_TRIES):
        worker, counters, _ = await scrape_one(base_url)
        seen[worker] = counters
        if len(seen) >= workers:
            return seen
        await trio.sleep(0.01)
    raise RuntimeError(f"only workers {sorted(seen)} of {workers} answered a scrape")


def summed(before: dict, after: dict) -> dict[str, float]:
    """What the workers did between two ``scrape_all``: each counter summed over workers."""
    return {
        name: sum(after[w].get(name, 0.0) - before.get(w, {}).get(name, 0.0) for w in after)
        for name in (*COUNTERS, COMMIT_SECONDS)
    }


async def wait_completed(base_url: str, runs: int, started: float) -> float:
    """Seconds since ``started`` until ``runs`` runs are completed (the store's count)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        while True:
            response = await client.get("/metrics")
            _, _, completed = parse(response.text)
            if completed is not None and completed >= runs:
                return time.perf_counter() - started
            await trio.sleep(0.05)
