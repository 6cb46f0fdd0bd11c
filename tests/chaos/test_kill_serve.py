"""Kill safety of `salvor serve`: a real daemon, a mixed workload, SIGKILL at random instants.

A real ``salvor serve --demo-tools --wake-interval 1`` subprocess on a real
store (an SQLite file, and PostgreSQL when ``SALVOR_TEST_POSTGRES_URL`` is
set) keeps 20 runs in flight, started over HTTP. Each run walks a plan of its
own, drawn from a seeded RNG: lookups (read), refunds (write), emails
(idempotent), some behind a ``request_approval`` gate and some asleep on a
one-second timer. The model is the scripted provider (an HTTP server in this
process, answering after a short random delay so calls are in flight when
the kills land); it counts every call it serves. The demo tools count every
side effect in their ledger.

The daemon is SIGKILLed at random instants (a seeded delay after READY,
bounded) and started again each time; it re-drives the interrupted runs by
itself. The test acts only as an operator would, over HTTP: it approves
gates (``POST /resume`` with the gate's input) and reconciles dangling
writes (``POST /resolve`` with what the ledger shows happened, then
``POST /resume`` to put the run back on a driver).

After every kill, with the daemon dead, the test reads the store and notes
which open intent each run was cut at: a model call the provider served, or a
tool whose effect the ledger shows, during the generation just killed. Those
are the only calls allowed to happen again. At the end:

* every log is contiguous and every event was legal after the ones before it
  (``check_batch(EMPTY_VIEW, log)``), and the store's materialised fold
  agrees with the log;
* every run completed, with one intent per planned tool, in plan order;
* no completed model call was served twice: the provider served each request
  hash of a log once, plus once per kill that cut it;
* no completed tool call happened twice: a lookup ran once plus once per
  cut; an email was delivered once per idempotency key (a re-execution
  under the same key after a cut is collapsed); refunds name one of a few
  shared invoices (a refund's identity), and each invoice was refunded by one
  run at most, every other run's refund of it copying that outcome
  (``deduplicated_from``); a refund ran at most once:
  one cut by a kill was probed by the restarted daemon (found in the
  ledger, its refund is the write's output; not there, it is performed once)
  or, where the probe could not tell (cut between sending it and recording
  the bank's answer), parked in needs_reconciliation for the operator.

``test_sigterm_mid_flight`` checks the graceful side: a SIGTERM with runs in
flight exits 0 within the deadline and the next start recovers them.

CI runs a short variant (10 kills on SQLite, 5 on PostgreSQL). The issue's long variant:

    SALVOR_CHAOS_KILLS=50 python -m pytest tests/chaos/test_kill_serve.py -k kills

``SALVOR_CHAOS_SEED`` picks the RNG seed (printed with every failure).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from salvor.protocol import EMPTY_VIEW, EventKind, RunState, check_batch
from salvor.store import EventStore

from tests.chaos.test_kill_cli import _tool_results
from tests.support.ports import free_port
from tests.support.scripted_provider import ProviderCall, Reply, ScriptedProvider
from tests.support.spawn import ONE_PROCESS, salvor_process

pytestmark = pytest.mark.kill

KILLS = int(os.environ.get("SALVOR_CHAOS_KILLS", "10"))
# On PostgreSQL half as many unless asked: a kill lands at the same random instants of the same
# daemon there, and what PostgreSQL adds (its commits, claims and locks across a dead process)
# each kill exercises alike; the SQLite run keeps the full count for the spread of instants.
PG_KILLS = int(os.environ.get("SALVOR_CHAOS_KILLS", str(KILLS // 2)))
SEED = int(os.environ.get("SALVOR_CHAOS_SEED", "20261129"))
CONCURRENT_RUNS = 20
# Refunds name one of this many invoices (a refund's identity): a dozen runs share each.
SHARED_INVOICES = 5
# A run whose refund's identity another run holds open waits for it to settle; the holder may be
# parked until the operator resolves it, so the wait outlasts the operator's round.
CLAIM_WAIT_SECONDS = "120"
# Delay between READY and the kill, in seconds: short enough that a kill often
# lands during recovery, long enough that runs make progress between kills.
KILL_DELAY = (0.05, 2.5)
# How long the provider takes to answer one call, in seconds.
PROVIDER_DELAY = (0.02, 0.25)
READY_TIMEOUT = 30.0
SETTLE_TIMEOUT = 180.0
# The daemon's graceful stop deadline (ServeConfig.shutdown_seconds).
SHUTDOWN_DEADLINE = 10.0

GATE_INPUT = {"approved": True, "note": "approved by the chaos operator"}
FINAL_TEXT = "all done"
TOOLS = ["lookup_invoice", "issue_refund", "send_email", "request_approval", "wait_until"]


# --------------------------------------------------------------------------
# The workload: a plan per run, carried in its input; the provider walks it
# --------------------------------------------------------------------------


def draw_plan(rng: random.Random, case: int) -> list[list[Any]]:
    """A run's tool calls, in order: 2-6 steps, at most one refund, sometimes a gate or a timer."""
    invoice = f"INV-{case}"
    steps: list[list[Any]] = [["lookup_invoice", {"invoice_id": invoice}]]
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["lookup_invoice", "send_email", "send_email"])
        if kind == "lookup_invoice":
            steps.append(["lookup_invoice", {"invoice_id": f"{invoice}-{len(steps)}"}])
        else:
            steps.append(
                [
                    "send_email",
                    {
                        "to": f"c{case}@example.com",
                        "subject": f"step {len(steps)}",
                        "body": f"about {invoice}",
                    },
                ]
            )
    if rng.random() < 0.35:
        steps.insert(
            rng.randint(1, len(steps)), ["request_approval", {"reason": f"refund {invoice}?"}]
        )
    if rng.random() < 0.6:
        # The refund's key is its invoice: runs share a few, so runs race on one identity
        # across kills, and exactly one of them may perform it.
        shared = f"INV-S{rng.randrange(SHARED_INVOICES)}"
        steps.insert(
            rng.randint(1, len(steps)),
            ["issue_refund", {"invoice_id": shared, "amount_cents": 100 + case}],
        )
    if rng.random() < 0.15:
        steps.insert(rng.randint(1, len(steps)), ["wait_until", {"seconds": 1}])
    return steps


def plan_script(call: ProviderCall) -> Reply:
    """Walk the plan in the run's input: with k tool results so far, call step k, else answer."""
    plan = json.loads(call.request["messages"][0]["content"][0]["text"])["plan"]
    return step_reply(call, plan)


def step_reply(call: ProviderCall, steps: list, *, final: str = FINAL_TEXT) -> Reply:
    """With k tool results in the conversation so far: call ``steps[k]`` (a tool name and its
    input), or answer ``final`` once every step has its result."""
    k = _tool_results(call)
    if k < len(steps):
        name, tool_input = steps[k]
        content = [{"type": "tool_use", "id": f"toolu_{k}", "name": name, "input": tool_input}]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": final}]
        stop = "end_turn"
    return {"model": call.request["model"], "content": content, "stop_reason": stop}, {
        "input_tokens": 10 + k,
        "output_tokens": 5,
    }


def agent_toml(
    base_url: str, name: str = "chaos", tools: Sequence[str] = TOOLS, flow_tools: Sequence[str] = ()
) -> str:
    """A built-in agent on the scripted provider at ``base_url``, offered ``tools``."""
    tables = "".join(f'\n[[tools]]\nname = "{tool}"\n' for tool in tools)
    return (
        f'name = "{name}"\nmodel = "scripted"\nmax_response_tokens = 256\n'
        f"flow_tools = {json.dumps(list(flow_tools))}\n"
        'system_prompt = "You settle refund requests."\n'
        f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\nmax_retries = 0\n'
        f"timeout_seconds = 30\n{tables}"
    )


# --------------------------------------------------------------------------
# The daemon: a real `salvor serve` process, READY heard on NOTIFY_SOCKET
# --------------------------------------------------------------------------


# The variable ``Daemon.allow_process_agents`` names with --auth-token.
TOKEN_VAR = "SALVOR_TEST_TOKEN"


class Daemon:
    """One `salvor serve` at a time on a fixed port; every start is a new generation."""

    def __init__(
        self, tmp_path: Path, store_url: str, effects: Path, *, one_process: bool = True
    ) -> None:
        """``one_process``: serve as one process (``ONE_PROCESS``); False serves with the
        default workers, as the README's commands do."""
        self.tmp_path = tmp_path
        self.store_url = store_url
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.notify_path = tmp_path / "notify.sock"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SALVOR_", "NOTIFY_", "WATCHDOG_"))
        }
        self.env.update(
            SALVOR_DEMO_EFFECTS=str(effects),
            SALVOR_CLAIM_WAIT_SECONDS=CLAIM_WAIT_SECONDS,
            NOTIFY_SOCKET=str(self.notify_path),
            PYTHONUNBUFFERED="1",
        )
        self.args = [  # salvor's: the process is tests/support/spawn's
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--store",
            store_url,
            "--wake-interval",
            "1",
            "--demo-tools",
            *(ONE_PROCESS if one_process else ()),
        ]
        self.proc: subprocess.Popen | None = None
        self.cwd: Path | None = None  # where the daemon runs (process agents' relative commands)
        # What ``client`` sends with every request (the token, once the daemon has one).
        self.headers: dict[str, str] = {}
        self.unix_socket: Path | None = None  # where it listens instead of the port, if set
        self.starts = 0
        self.ready_seconds: list[float] = []
        # A supervisor is READY once each worker is, worker 0 first: two interpreters' starts.
        self.ready_timeout = READY_TIMEOUT if one_process else 3 * READY_TIMEOUT

    def listen_on(self, unix_socket: Path) -> None:
        """Listen on a Unix socket instead of the port (``client`` speaks it)."""
        self.unix_socket = unix_socket
        self.args[self.args.index("--listen") + 1] = f"unix:{unix_socket}"
        self.base_url = "http://localhost"

    def allow_process_agents(self) -> None:
        """``--allow-process-agents``, which a daemon on TCP takes only with a token: the daemon
        gets one, and ``client`` sends it (on a Unix socket it needs none)."""
        self.args.append("--allow-process-agents")
        if self.unix_socket is None:
            token = secrets.token_urlsafe(24)
            self.env[TOKEN_VAR] = token
            self.args += ["--auth-token", TOKEN_VAR]
            self.headers = {"Authorization": f"Bearer {token}"}

    def client(self, **options: Any) -> httpx.Client:
        """An HTTP client of this daemon (with its token, when it has one)."""
        if self.unix_socket is not None:
            options["transport"] = httpx.HTTPTransport(uds=str(self.unix_socket))
        return httpx.Client(base_url=self.base_url, headers=self.headers, **options)

    def start(self) -> None:
        """Start the daemon and wait for READY=1 (it has recovered its interrupted runs by then)."""
        self.notify_path.unlink(missing_ok=True)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.bind(str(self.notify_path))
            notify.settimeout(0.2)
            with open(self.tmp_path / f"serve-{self.starts:03d}.log", "wb") as log:
                began = time.monotonic()
                self.proc = salvor_process(
                    self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd
                )
            self.starts += 1
            while True:
                try:
                    if b"READY=1" in notify.recv(4096).split(b"\n"):
                        break
                except TimeoutError:
                    pass
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"salvor serve exited {self.proc.returncode} before READY\n{self.log()}"
                    )
                if time.monotonic() - began > self.ready_timeout:
                    raise AssertionError(
                        f"salvor serve not READY within {self.ready_timeout}s\n{self.log()}"
                    )
            self.ready_seconds.append(time.monotonic() - began)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def terminate(self) -> tuple[int, float]:
        """SIGTERM; returns (exit status, seconds until the process was gone)."""
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=SHUTDOWN_DEADLINE + 20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"salvor serve ignored SIGTERM\n{self.log()}") from None
        return code, time.monotonic() - began

    def log(self, which: int = -1) -> str:
        index = self.starts - 1 if which < 0 else which
        return (self.tmp_path / f"serve-{index:03d}.log").read_text(errors="replace")[-6000:]


# --------------------------------------------------------------------------
# The harness: provider, daemon, operator, and what every kill cut
# --------------------------------------------------------------------------


@dataclass
class Cuts:
    """Calls a stop of the daemon left open after their effect started
    (each may happen once more)."""

    model: Counter = field(default_factory=Counter)  # request hash (hex) -> cuts
    tool: Counter = field(default_factory=Counter)  # (run_id, seq) -> cuts


class Chaos:
    def __init__(
        self, tmp_path: Path, store_url: str, seed: int, script: Callable = plan_script
    ) -> None:
        self.store_url = store_url
        self.rng = random.Random(seed)
        self.effects = tmp_path / "effects.jsonl"
        self.generation = 0
        self._served_in: dict[int, int] = {}  # provider call index -> generation
        self._delay_rng = random.Random(seed + 1)
        self._delay_lock = threading.Lock()
        self.provider = ScriptedProvider(script, on_call=self._on_call)
        self.daemon = Daemon(tmp_path, store_url, self.effects)
        self.daemon.args += ["--model-endpoint", self.provider.base_url]
        self.http = httpx.Client(base_url=self.daemon.base_url, timeout=10)
        self.agent: str | None = None
        self.plans: dict[str, list] = {}
        self.created: set[str] = set()  # runs whose 201 (or run_exists) we saw
        self.cuts = Cuts()
        self.ledger_mark = 0
        self.resolved: dict[
            tuple[str, int], tuple[Any, bool]
        ] = {}  # (run, seq) -> (output, ledger showed it)
        self.gate_posts: Counter = Counter()  # gate resumes sent, per run
        self.resolve_resumes: Counter = Counter()
        self.transport_errors = 0

    def close(self) -> None:
        if self.daemon.proc is not None and self.daemon.alive():
            self.daemon.kill()
        self.http.close()
        self.provider.stop()

    # -- provider hook (provider threads) ----------------------------------------

    def _on_call(self, call: ProviderCall) -> None:
        self._served_in[call.index] = self.generation
        with self._delay_lock:
            delay = self._delay_rng.uniform(*PROVIDER_DELAY)
        time.sleep(delay)

    # -- HTTP, tolerant of a daemon that dies mid-request -------------------------

    def call(self, method: str, path: str, **kwargs) -> httpx.Response | None:
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.TransportError:
            self.transport_errors += 1
            return None

    def register_agent(self) -> None:
        response = self.http.post(
            "/v1/agents",
            content=agent_toml(self.provider.base_url),
            headers={"content-type": "application/toml"},
        )
        assert response.status_code == 201, response.text
        self.agent = response.json()["agent"]

    def new_run(self) -> None:
        run_id = str(uuid.uuid4())
        case = len(self.plans)
        self.plans[run_id] = draw_plan(self.rng, case)

    def post_runs(self) -> None:
        """Create every planned run not yet known to exist (the id makes a retry safe)."""
        for run_id in [r for r in self.plans if r not in self.created]:
            body = {
                "agent": self.agent,
                "run_id": run_id,
                "labels": {"suite": "chaos"},
                "input": {"case": list(self.plans).index(run_id), "plan": self.plans[run_id]},
            }
            response = self.call("POST", "/v1/runs", json=body)
            if response is None:
                return
            if response.status_code == 201 or (
                response.status_code == 409 and response.json()["error"]["code"] == "run_exists"
            ):
                self.created.add(run_id)
            else:
                raise AssertionError(
                    f"POST /v1/runs answered {response.status_code}: {response.text}"
                )

    def listed(self, status: str) -> list[dict] | None:
        response = self.call("GET", "/v1/runs", params={"status": status, "label": "suite:chaos"})
        if response is None:
            return None
        assert response.status_code == 200, response.text
        return response.json()["runs"]

    def active(self) -> int:
        """Runs not yet completed (as the daemon lists them), or None when it did not answer."""
        done = self.listed("completed")
        if done is None:
            return -1
        finished = {r["run"] for r in done}
        for run in done:
            assert run["status"]["state"] == "completed"
        return len([r for r in self.plans if r not in finished])

    # -- the operator ----------------------------------------------------------------

    def operate(self, *, top_up: bool) -> int:
        """One round: start runs to keep 20 in flight, approve gates, reconcile writes.

        Returns how many runs are not completed yet (-1 when the daemon did not answer).
        """
        active = self.active()
        if active < 0:
            return -1
        if top_up:
            for _ in range(CONCURRENT_RUNS - active):
                self.new_run()
        self.post_runs()
        for run in self.listed("suspended") or []:
            if run["run"] in self.plans:
                self.gate_posts[run["run"]] += 1
                self.call("POST", f"/v1/runs/{run['run']}/resume", json={"input": GATE_INPUT})
        for run in self.listed("needs_reconciliation") or []:
            if run["run"] in self.plans and run.get("driver") == "none":
                self.reconcile(run["run"])
        return self.active()

    def ledger(self) -> list[dict]:
        """What happened in the world (a refund's request to the bank, which its probe reads, is
        left out: the refund is the bank's answer)."""
        if not self.effects.exists():
            return []
        records = map(json.loads, self.effects.read_text(encoding="utf-8").splitlines())
        return [r for r in records if r["tool"] != "issue_refund:sent"]

    def reconcile(self, run_id: str) -> None:
        """What a person does with a dangling write: look in the world, record it, resume."""
        response = self.call("GET", f"/v1/runs/{run_id}")
        if response is None:
            return
        body = response.json()
        if body["status"]["state"] != "needs_reconciliation" or body.get("driver") != "none":
            return
        pending = body["pending"]
        assert pending["kind"] == "tool" and pending["effect"] == "write", body
        assert pending["tool"] == "issue_refund", body
        seq = pending["seq"]
        happened = any(
            r["run_id"] == run_id and r["seq"] == seq and r["tool"] == "issue_refund"
            for r in self.ledger()
        )
        if happened:
            output = {"refund_id": "rf_checked_by_hand", **pending["input"]}
        else:
            output = {"refunded": False, "note": "no refund found at the payment provider"}
        self.resolved[(run_id, seq)] = (output, happened)
        response = self.call("POST", f"/v1/runs/{run_id}/resolve", json={"output": output})
        if response is None:
            return
        if response.status_code == 409:
            # A resolve cut by a kill already landed; the log decides below.
            assert response.json()["error"]["code"] == "wrong_state", response.text
        else:
            assert response.status_code == 200, response.text
        self.resolve_resumes[run_id] += 1
        self.call("POST", f"/v1/runs/{run_id}/resume")

    # -- generations ------------------------------------------------------------------

    def settle_stop(self) -> None:
        """With the daemon gone: note every open intent whose effect
        started in the last generation."""
        assert not self.daemon.alive()
        # Requests already in the provider's socket buffers are still read and counted.
        time.sleep(0.4)
        records = self.ledger()
        fresh = Counter((r["run_id"], r["seq"]) for r in records[self.ledger_mark :])
        served = {
            c.request_hash
            for c in self.provider.calls
            if self._served_in.get(c.index) == self.generation
        }
        with EventStore.open(self.store_url) as store:
            for run_id in self.created | set(self.plans):
                log = store.read_log(run_id)
                if not log:
                    continue
                view = assert_log_valid(log)
                assert store.read_view(run_id) == view, (
                    f"run {run_id}: runs row and log disagree after a stop"
                )
                pending = view.pending
                if pending is None:
                    continue
                if (
                    pending.kind == "model"
                    and pending.request_hash.removeprefix("sha256:") in served
                ):
                    self.cuts.model[pending.request_hash.removeprefix("sha256:")] += 1
                elif pending.kind == "tool" and fresh[(run_id, pending.seq)]:
                    assert fresh[(run_id, pending.seq)] == 1, (run_id, pending)
                    self.cuts.tool[(run_id, pending.seq)] += 1
                if pending.kind == "tool" and pending.effect == "write":
                    # Every open write is parked: the fold says so, and no driver may touch it.
                    assert view.state is RunState.NEEDS_RECONCILIATION, view.status()
        self.ledger_mark = len(records)
        self.generation += 1

    def operate_until(self, deadline: float, *, top_up: bool) -> int:
        remaining = -1
        while time.monotonic() < deadline and self.daemon.alive():
            remaining = self.operate(top_up=top_up)
            if remaining == 0 and not top_up:
                return 0
            time.sleep(0.05)
        return remaining

    def finish(self) -> None:
        """Start the daemon, approve and reconcile until every run
        completed, stop it with SIGTERM."""
        self.daemon.start()
        remaining = self.operate_until(time.monotonic() + SETTLE_TIMEOUT, top_up=False)
        assert remaining == 0, (
            f"{remaining} runs did not complete\n{self.stuck()}\n{self.daemon.log()}"
        )
        code, _ = self.daemon.terminate()
        assert code == 0, self.daemon.log()
        self.settle_stop()

    def stuck(self) -> str:
        lines = []
        with EventStore.open(self.store_url) as store:
            for run_id in self.plans:
                view = store.read_view(run_id)
                if view is None or view.state is not RunState.COMPLETED:
                    lines.append(f"{run_id}: {view.status() if view else 'no log'}")
        return "\n".join(lines[:20])

    # -- the invariants ----------------------------------------------------------------

    @staticmethod
    def check_refunds(refunds: dict[str, list], ledger: list[dict]) -> int:
        """No identity performed twice: each invoice was refunded by one run at most, and every
        other run's refund of it copies that one's outcome. Returns how many copied."""
        copies = 0
        happened = [r for r in ledger if r["tool"] == "issue_refund"]
        for invoice, calls in refunds.items():
            performed = [c for c in calls if c[2].deduplicated_from is None]
            assert len(performed) == 1, (invoice, [(r, q, d) for r, q, d, _ in performed])
            (holder_run, holder_seq, holder_done, _) = performed[0]
            assert len([r for r in happened if r["input"]["invoice_id"] == invoice]) <= 1, invoice
            for _, _, done, _ in calls:
                if done.deduplicated_from is not None:
                    assert done.deduplicated_from == {"run_id": holder_run, "seq": holder_seq}
                    assert done.output == holder_done.output, invoice
                    copies += 1
        return copies

    def check(self) -> dict:
        ledger = self.ledger()
        records: dict[tuple[str, int], list[dict]] = {}
        for record in ledger:
            records.setdefault((record["run_id"], record["seq"]), []).append(record)
        served = self.provider.count_by_request_hash()
        expected_calls = 0
        delivered_per_key: Counter = Counter(
            r["idempotency_key"] for r in ledger if r["tool"] == "send_email" and r["delivered"]
        )
        parked_writes = 0
        refunds: dict[str, list] = defaultdict(list)
        with EventStore.open(self.store_url) as store:
            for run_id, plan in self.plans.items():
                log = store.read_log(run_id)
                where = f"run {run_id} (seed {SEED})"
                view = assert_log_valid(log)
                assert store.read_view(run_id) == view, where
                assert view.state is RunState.COMPLETED, f"{where}: {view.status()}"
                assert view.detail["output"] == FINAL_TEXT, where
                events = [e.event for e in log]
                head = events[0]
                assert head.input["plan"] == plan, where

                # Model calls: each once, plus once per kill that cut it.
                requested = [
                    e.request_hash.removeprefix("sha256:")
                    for e in events
                    if e.KIND is EventKind.MODEL_CALL_REQUESTED
                ]
                assert len(requested) == len(set(requested)) == len(plan) + 1, where
                for request_hash in requested:
                    want = 1 + self.cuts.model[request_hash]
                    assert served[request_hash] == want, (
                        f"{where}: model call {request_hash[:12]} served {served[request_hash]} "
                        f"times, expected {want} ({self.cuts.model[request_hash]} cut by kills)"
                    )
                    expected_calls += want

                # Tool calls: one intent per planned step, in order, each completed.
                intents = [e for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]
                assert [e.event.tool for e in intents] == [name for name, _ in plan], where
                completions = {
                    e.event.seq: e.event
                    for e in log
                    if e.event.KIND is EventKind.TOOL_CALL_COMPLETED
                }
                for intent in intents:
                    seq, tool = intent.seq, intent.event.tool
                    done = completions[seq]
                    ran = records.get((run_id, seq), [])
                    assert all(r["tool"] == tool for r in ran), (where, ran)
                    cut = self.cuts.tool[(run_id, seq)]
                    if tool == "lookup_invoice":
                        assert len(ran) == 1 + cut, (where, seq, ran, cut)
                    elif tool == "send_email":
                        key = intent.event.idempotency_key
                        assert key and all(r["idempotency_key"] == key for r in ran), (where, ran)
                        assert len(ran) == 1 + cut, (where, seq, ran, cut)
                        assert [r["delivered"] for r in ran] == [True] + [False] * cut, (where, ran)
                        assert delivered_per_key[key] == 1, (where, key)
                    elif tool == "issue_refund":
                        assert len(ran) <= 1, (
                            f"{where}: refund at seq {seq} happened {len(ran)} times"
                        )
                        invoice = intent.event.input["invoice_id"]
                        assert intent.event.idempotency_key, (where, seq)
                        refunds[invoice].append((run_id, seq, done, ran))
                        if done.deduplicated_from is not None:
                            # Another run's refund of this invoice: nothing performed here.
                            assert ran == [] and cut == 0, (where, seq, ran, cut)
                        elif done.settled_by == "operator":
                            output, happened = self.resolved[(run_id, seq)]
                            assert done.output == output, where
                            assert len(ran) == int(happened), (where, ran, happened)
                            parked_writes += 1
                        elif done.settled_by == "probe":
                            assert len(ran) == 1 and done.output == ran[0]["refund"], (where, ran)
                            assert done.probe["tool"] == "lookup_refund", where
                        else:
                            assert done.settled_by is None and cut == 0, (where, seq, cut)
                            assert len(ran) == 1, (where, ran)
                    else:
                        assert ran == [], (where, ran)

                # No action but ours: every resume input is the gate's, sent by us.
                resumes = [e for e in events if e.KIND is EventKind.RESUMED]
                suspensions = [e for e in events if e.KIND is EventKind.SUSPENDED]
                assert len(resumes) == len(suspensions), where
                assert all(e.input == GATE_INPUT for e in resumes), where
                assert len(resumes) <= self.gate_posts[run_id], where
                assert not any(e.KIND is EventKind.RUN_ABANDONED for e in events), where
                assert all(
                    e.settled_by in (None, "probe") or (run_id, e.seq) in self.resolved
                    for e in completions.values()
                ), where

        copies = self.check_refunds(refunds, ledger)

        # Nothing was served that no log asked for.
        assert self.provider.call_count == expected_calls, (
            self.provider.call_count,
            expected_calls,
        )
        return {
            "runs": len(self.plans),
            "model_calls": self.provider.call_count,
            "model_calls_cut": sum(self.cuts.model.values()),
            "tool_calls_cut": sum(self.cuts.tool.values()),
            "writes_reconciled": parked_writes,
            "refunds_copied": copies,
            "gate_resumes": sum(self.gate_posts.values()),
            "daemon_starts": self.daemon.starts,
            "ready_seconds_max": round(max(self.daemon.ready_seconds), 3),
        }


def assert_log_valid(log: list) -> Any:
    """Contiguous from seq 0, one run, every event legal after the ones before it."""
    assert [e.seq for e in log] == list(range(len(log))), "the log has a gap"
    assert len({e.run_id for e in log}) == 1
    return check_batch(EMPTY_VIEW, log)


@pytest.fixture
def chaos(tmp_path: Path, store_url: str):
    harness = Chaos(tmp_path, store_url, SEED)
    try:
        yield harness
    finally:
        harness.close()


# --------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------


def test_random_kills(chaos: Chaos) -> None:
    """SIGKILL the daemon KILLS times at random instants under 20
    concurrent runs, restart each time."""
    began = time.monotonic()
    kill_rng = random.Random(SEED + 2)
    kills = KILLS if chaos.store_url.startswith("sqlite") else PG_KILLS
    chaos.daemon.start()
    chaos.register_agent()
    for _ in range(kills):
        if not chaos.daemon.alive():
            chaos.daemon.start()
        # The kill comes from another thread, so it may land inside any request
        # the operator has open, as well as anywhere in the daemon.
        killer = threading.Timer(kill_rng.uniform(*KILL_DELAY), chaos.daemon.kill)
        killer.start()
        chaos.operate_until(time.monotonic() + KILL_DELAY[1] + 5, top_up=True)
        killer.join()
        assert chaos.daemon.proc.returncode == -signal.SIGKILL, chaos.daemon.log()
        chaos.settle_stop()
    chaos.finish()
    figures = chaos.check()
    figures.update(kills=kills, seed=SEED, seconds=round(time.monotonic() - began, 1))
    print("chaos:", json.dumps(figures))


def test_sigterm_mid_flight(chaos: Chaos) -> None:
    """SIGTERM with 20 runs in flight: exit 0 within the deadline; the next start finishes them."""
    chaos.daemon.start()
    chaos.register_agent()
    for _ in range(CONCURRENT_RUNS):
        chaos.new_run()
    chaos.post_runs()
    assert len(chaos.created) == CONCURRENT_RUNS
    # A watcher on the stream of one run: a graceful stop ends it.
    watched = next(iter(chaos.plans))
    ended, watching = threading.Event(), threading.Event()
    frames: list[str] = []

    def watch() -> None:
        try:
            with httpx.stream(
                "GET",
                f"{chaos.daemon.base_url}/v1/runs/{watched}/events",
                timeout=SHUTDOWN_DEADLINE + 20,
            ) as response:
                for line in response.iter_lines():
                    frames.append(line)
                    watching.set()
        except httpx.TransportError as exc:
            frames.append(f"<transport error: {exc!r}>")
        ended.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # Mid-flight: model calls are being served.
    chaos.provider.wait_for_calls(CONCURRENT_RUNS + 10, timeout=30)
    # The stop is about a stream that is open: on a loaded machine the
    # watcher may still be connecting.
    assert watching.wait(30), f"the watcher never received a frame: {frames}"
    running = chaos.listed("running") or []
    code, seconds = chaos.daemon.terminate()
    assert code == 0, chaos.daemon.log()
    assert seconds < SHUTDOWN_DEADLINE, f"graceful stop took {seconds:.1f}s\n{chaos.daemon.log()}"
    assert ended.wait(5), "the event stream outlived the daemon"
    assert "event: end" in frames, frames[-5:]
    log = chaos.daemon.log()
    assert "Traceback" not in log, log
    chaos.settle_stop()
    with EventStore.open(chaos.store_url) as store:
        interrupted = [r for r in chaos.plans if not store.read_view(r).resting]
    assert interrupted, "no run was mid-flight at SIGTERM"
    chaos.finish()
    figures = chaos.check()
    print(
        "sigterm:",
        json.dumps(
            {
                **figures,
                "stop_seconds": round(seconds, 3),
                "interrupted": len(interrupted),
                "listed_running": len(running),
            }
        ),
    )
