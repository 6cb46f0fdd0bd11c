"""A store that stops taking writes under a live daemon, then takes them
again: the runs heal by themselves.

A real ``salvor serve`` keeps its SQLite store on a small tmpfs this test
mounts (root only; skipped, naming why, elsewhere), or, for the immutable
case, in ``tmp_path`` (tmpfs lets a file made immutable be written through a
descriptor opened before; ext4 does not). Three runs are mid-call at the
scripted provider when the store stops taking writes, either because the
filesystem is full (a filler file takes every free byte) or because the
store's files are made immutable (``chattr +i``, root only). Their model answers then
cannot be recorded: each drive stops on a store error, and a new run is
refused with ``503 store_unavailable``. Once the space is freed (or the
files are mutable again) every run goes on to completion with nobody
resuming it, and the daemon's log says it re-drove each one. Before the
healer, the runs stayed in awaiting_model until a resume or a restart.

Composed runs (graph runs mapping over items, subagent parents) heal the same
way, from their roots: a child is driven by its root's drive, so the fault
under it stops the root's, which the healer drives again.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.chaos.test_kill_serve import Daemon
from tests.support.disk import Filler, TmpfsRefused, tmpfs
from tests.support.flows import offered_tools, tool_results, tool_use
from tests.support.runtime import ledger
from tests.support.scripted_provider import ProviderCall, ScriptedProvider, text_reply

RUNS = 3
BOUND = 60.0  # seconds any one wait of this test may take before it fails


def _wait_for(what: str, check, daemon: Daemon, seconds: float = BOUND):
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds:g}s\n{daemon.log()}")
        time.sleep(0.05)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 16 MiB tmpfs of the test's own, unmounted afterwards."""
    try:
        with tmpfs(tmp_path / "disk", "16m") as mount:
            yield mount
    except TmpfsRefused as refused:
        pytest.skip(str(refused))


class FullDisk(Filler):
    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        super().__init__(request.getfixturevalue("small_disk"))


class Immutable:
    """The store file, its WAL and their directory made immutable (the -shm map is left alone)."""

    name = "immutable store"

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        if shutil.which("chattr") is None:
            pytest.skip("chattr is not installed (install e2fsprogs)")
        self.store_dir = tmp_path / "store"
        self.store_dir.mkdir()
        probe = self.store_dir / "probe"
        probe.touch()
        done = subprocess.run(
            ["chattr", "+i", str(probe)], capture_output=True, text=True, check=False
        )
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True, check=False)
        probe.unlink()
        if done.returncode != 0:
            pytest.skip(
                f"chattr +i is refused here (it needs root and a filesystem that supports it): "
                f"{done.stderr.strip()}"
            )
        self.paths = [
            self.store_dir / "salvor.db",
            self.store_dir / "salvor.db-wal",
            self.store_dir,
        ]
        request.addfinalizer(self.end)

    def begin(self) -> None:
        subprocess.run(["chattr", "+i", *map(str, self.paths)], check=True)

    def end(self) -> None:
        subprocess.run(["chattr", "-i", *map(str, self.paths)], capture_output=True, check=False)


def agent_toml(base_url: str) -> str:
    return (
        'name = "faults"\nmodel = "scripted"\nmax_response_tokens = 64\n'
        'system_prompt = "You answer at once."\n'
        f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\n'
        "max_retries = 0\ntimeout_seconds = 60\n"
    )


@pytest.mark.parametrize("fault", [FullDisk, Immutable], ids=["full-disk", "immutable"])
def test_runs_stopped_by_a_store_fault_finish_once_the_store_takes_writes(
    request, tmp_path: Path, fault
) -> None:
    fault = fault(request, tmp_path)
    held = threading.Event()
    blocked: list[int] = []

    def on_call(call: ProviderCall) -> None:
        # The first call of each run waits until the store has stopped taking writes.
        if call.index < RUNS:
            blocked.append(call.index)
            held.wait(BOUND)

    provider = ScriptedProvider(lambda call: text_reply("settled"), on_call=on_call)
    daemon = Daemon(
        tmp_path, f"sqlite:///{fault.store_dir / 'salvor.db'}", tmp_path / "effects.jsonl"
    )
    # A full store filesystem, not the free-space floor, is what these runs meet.
    daemon.args += ["--min-free-bytes", "0"]
    # The operator declares the provider, so an agent registered over HTTP may name it.
    daemon.args += ["--model-endpoint", provider.base_url]
    http = daemon.client(timeout=30)
    try:
        daemon.start()
        registered = http.post(
            "/v1/agents",
            content=agent_toml(provider.base_url),
            headers={"content-type": "application/toml"},
        )
        assert registered.status_code == 201, registered.text
        agent = registered.json()["agent"]
        run_ids = []
        for n in range(RUNS):
            created = http.post("/v1/runs", json={"agent": agent, "input": {"case": n}})
            assert created.status_code == 201, created.text
            run_ids.append(created.json()["run"])
        _wait_for(
            "every run's first model call reaching the provider",
            lambda: len(blocked) == RUNS,
            daemon,
        )

        fault.begin()
        refused = http.post(
            "/v1/runs",
            json={"agent": agent, "input": {"case": "during"}, "run_id": str(uuid.uuid4())},
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "store_unavailable"
        held.set()  # the answers arrive; recording them fails
        _wait_for(
            "every drive stopping on the store error",
            lambda: all(f"run {run_id}: drive stopped: " in daemon.log() for run_id in run_ids),
            daemon,
        )
        for run_id in run_ids:
            assert http.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "awaiting_model"
        # Health is answered from memory while the store refuses writes, and
        # counts the runs waiting to heal.
        health = http.get("/v1/health")
        assert health.status_code == 200 and health.json() == {
            "status": "ok",
            "recovering": 0,
            "healing": RUNS,
        }

        fault.end()

        def completed() -> bool:
            return all(
                http.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "completed"
                for run_id in run_ids
            )

        began = time.monotonic()
        _wait_for(
            f"every run completing after the {fault.name} passed, with nobody resuming it",
            completed,
            daemon,
        )
        print(
            f"{fault.name}: all {RUNS} runs completed "
            f"{time.monotonic() - began:.1f}s after the store healed"
        )
        _wait_for(
            "health counting no run left to heal",
            lambda: http.get("/v1/health").json()["healing"] == 0,
            daemon,
        )
        log = daemon.log()
        for run_id in run_ids:
            assert re.search(
                rf"re-driving run {run_id} after a store error \(attempt \d+\)", log
            ), log
            assert f"run {run_id}: re-driven after a store error, it got past the store" in log, log
        # Each run's model call was paid once more (its answer was never recorded), and no more.
        assert provider.call_count == 2 * RUNS
    finally:
        held.set()
        if daemon.proc is not None and daemon.alive():
            daemon.terminate()
        http.close()
        provider.stop()


CALLER = """\
import os, sys, httpx
base = os.environ["ANTHROPIC_BASE_URL"].rstrip("/")
answer = httpx.post(base + "/v1/messages", timeout=120,
                    headers={"x-api-key": os.environ.get("ANTHROPIC_API_KEY", "")},
                    json={"model": "scripted", "max_tokens": 64,
                          "messages": [{"role": "user", "content": os.environ["SALVOR_PROMPT"]}]})
answer.raise_for_status()
print(answer.json()["content"][0]["text"])
"""


def test_a_process_run_whose_model_answer_the_full_disk_refused_is_driven_again_not_failed(
    request, tmp_path: Path
) -> None:
    """The agent's call fails because of the store, so its exit is the
    store's doing: no RunFailed."""
    held = threading.Event()

    def on_call(call: ProviderCall) -> None:
        if call.index == 0:
            held.wait(BOUND)

    provider = ScriptedProvider(lambda call: text_reply("settled"), on_call=on_call)
    filler = FullDisk(request, tmp_path)
    daemon = Daemon(
        tmp_path, f"sqlite:///{filler.store_dir / 'salvor.db'}", tmp_path / "effects.jsonl"
    )
    # A full store filesystem, not the free-space floor, is what these runs meet.
    daemon.args += ["--min-free-bytes", "0"]
    daemon.env.update(SALVOR_AGENT_UPSTREAM=provider.base_url)
    daemon.allow_process_agents()
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    definition = (
        f'kind = "process"\ncommand = {json.dumps([sys.executable, str(script)])}\ntimeout = 120\n'
    )
    http = daemon.client(timeout=30)
    try:
        daemon.start()
        agent = http.post(
            "/v1/agents", content=definition, headers={"content-type": "application/toml"}
        ).json()["agent"]
        run_id = http.post("/v1/runs", json={"agent": agent, "input": "settle A-1"}).json()["run"]
        _wait_for(
            "the agent's model call reaching the provider", lambda: provider.call_count == 1, daemon
        )
        filler.begin()
        held.set()
        _wait_for(
            "the drive stopping on the store error",
            lambda: f"run {run_id}: drive stopped: " in daemon.log(),
            daemon,
        )
        assert http.get(f"/v1/runs/{run_id}").json()["status"]["state"] != "failed"
        filler.end()

        def settled() -> str:
            state = http.get(f"/v1/runs/{run_id}").json()["status"]["state"]
            return state if state in ("completed", "failed") else ""

        assert (
            _wait_for("the run settling once the disk has room", settled, daemon) == "completed"
        ), daemon.log()
        assert re.search(
            rf"re-driving run {run_id} after a store error \(attempt \d+\)", daemon.log()
        )
        assert provider.call_count == 2
    finally:
        held.set()
        if daemon.proc is not None and daemon.alive():
            daemon.terminate()
        http.close()
        provider.stop()


REFUNDER = """\
name = "refunder"
model = "scripted"
max_response_tokens = 64
system_prompt = "You refund the invoice you are given."
[[tools]]
name = "issue_refund"
"""
DELEGATOR = """\
name = "delegator"
model = "scripted"
max_response_tokens = 64
system_prompt = "You hand refunds to the refunder."
flow_tools = ["subagent"]
"""
INVOICE = re.compile(r"INV-\d+")


def composed_agent(toml: str, base_url: str) -> str:
    return (
        toml
        + f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\nmax_retries = 0\n'
        + "timeout_seconds = 60\n"
    )


def test_graph_runs_and_subagent_trees_stopped_by_a_full_disk_heal_from_their_roots(
    request, tmp_path: Path
) -> None:
    """Map items' children and subagents' children are mid-call when the disk fills; their
    store faults stop their roots' drives as store faults, ``healing`` counts the roots, and
    once the disk has room every tree completes with no restart and no resume, each invoice
    refunded once. Before, a map child's fault reached the driving set as an exception group
    (a crashed drive) and a subagent child's as a stopped call: nothing healed, ``healing``
    said 0, and the trees waited for a restart."""
    disk = FullDisk(request, tmp_path)
    held = threading.Event()
    blocked: list[int] = []

    def script(call: ProviderCall):
        invoice = INVOICE.search(json.dumps(call.request["messages"][0])).group(0)
        if "subagent" in offered_tools(call):
            if not tool_results(call):
                return tool_use("subagent", {"agent": "refunder", "task": f"refund {invoice}"})
            return text_reply("delegated")
        if not tool_results(call):
            return tool_use("issue_refund", {"invoice_id": invoice, "amount_cents": 700})
        return text_reply(f"refunded {invoice}")

    def on_call(call: ProviderCall) -> None:
        # Every refunder's answer after its refund waits until the disk is full.
        if "subagent" not in offered_tools(call) and tool_results(call):
            blocked.append(call.index)
            held.wait(BOUND)

    provider = ScriptedProvider(script, on_call=on_call)
    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, f"sqlite:///{disk.store_dir / 'salvor.db'}", effects)
    # A full store filesystem, not the free-space floor, is what these runs meet.
    daemon.args += ["--min-free-bytes", "0"]
    daemon.args += ["--model-endpoint", provider.base_url]
    http = daemon.client(timeout=30)
    try:
        daemon.start()
        agents = {}
        for toml in (REFUNDER, DELEGATOR):
            registered = http.post(
                "/v1/agents",
                content=composed_agent(toml, provider.base_url),
                headers={"content-type": "application/toml"},
            )
            assert registered.status_code == 201, registered.text
            agents[toml] = registered.json()["agent"]
        document = {
            "schema_version": 1,
            "nodes": [
                {
                    "id": "each",
                    "kind": "map",
                    "over": "$input",
                    "concurrency": 2,
                    "body": {"kind": "agent", "agent": agents[REFUNDER], "input": "$item"},
                },
                {"id": "tally", "kind": "fold", "over": "$nodes.each", "reducer": "count"},
            ],
            "edges": [{"from": "each", "to": "tally"}],
        }
        graph = http.post("/v1/graphs", json=document)
        assert graph.status_code in (200, 201), graph.text
        roots, invoices = [], []
        for batch in (["INV-101", "INV-102"], ["INV-111", "INV-112"]):
            items = [{"invoice_id": invoice} for invoice in batch]
            started = http.post(
                "/v1/graph-runs", json={"graph_hash": graph.json()["graph"], "input": items}
            )
            assert started.status_code == 201, started.text
            roots.append(started.json()["run"])
            invoices += batch
        for invoice in ("INV-201", "INV-202"):
            started = http.post(
                "/v1/runs", json={"agent": agents[DELEGATOR], "input": f"refund {invoice}"}
            )
            assert started.status_code == 201, started.text
            roots.append(started.json()["run"])
            invoices.append(invoice)
        _wait_for(
            "every child's answer after its refund reaching the provider",
            lambda: len(blocked) == len(invoices),
            daemon,
        )

        disk.begin()
        held.set()  # the answers arrive; recording them fails
        # Health counts the trees waiting to heal by their roots (a child is its root's drive).
        _wait_for(
            "health counting every root as healing",
            lambda: http.get("/v1/health").json()["healing"] == len(roots),
            daemon,
        )
        for run_id in roots:
            assert http.get(f"/v1/runs/{run_id}").json()["status"]["state"] != "completed"
        disk.end()

        def completed() -> bool:
            return all(
                http.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "completed"
                for run_id in roots
            )

        _wait_for("every tree completing with nobody resuming it", completed, daemon)
        _wait_for(
            "health counting no run left to heal",
            lambda: http.get("/v1/health").json()["healing"] == 0,
            daemon,
        )
        listed = http.get("/v1/runs", params={"limit": 100}).json()["runs"]
        assert len(listed) == len(roots) + len(invoices)
        assert {run["status"]["state"] for run in listed} == {"completed"}, listed
        log = daemon.log()
        assert "drive crashed" not in log, log
        for run_id in roots:
            assert re.search(rf"re-driving run {run_id} after a store error", log), log
        refunded = sorted(
            r["input"]["invoice_id"] for r in ledger(effects) if r["tool"] == "issue_refund"
        )
        assert refunded == sorted(invoices)
    finally:
        held.set()
        if daemon.proc is not None and daemon.alive():
            daemon.terminate()
        http.close()
        provider.stop()
