"""Kill safety of the `salvor` CLI: a real process, a real store, a real SIGKILL.

Every test starts a real ``salvor run`` subprocess against a real store (an
SQLite file, and PostgreSQL when ``SALVOR_TEST_POSTGRES_URL`` is set) and a
real model provider (the scripted one, an HTTP server in this process),
kills it with SIGKILL at a chosen instant, and recovers the run the way a
person would: ``salvor resume`` until it rests, and ``salvor resolve`` when a
write was left with an unknown outcome. The instants:

* after every commit boundary (``SALVOR_FAULT_KILL_AFTER_SEQ=N`` for the
  first seq N of every commit of the run: a later seq of the same commit dies
  at the same instant),
* inside every model call (the provider kills the caller before answering),
* inside every tool, after its side effect and before its completion is
  recorded (``SALVOR_FAULT_KILL_IN_TOOL``),
* and a few sequences of kills across the recovering processes.

After every scenario the invariants hold: the log is contiguous and every
event of it was a legal next event; the run completed with the same shape of
log as an uninterrupted run; no completed model call was served twice (the
provider counts what it served); no completed tool call's effect happened
twice (the demo tools' side-effect ledger counts what happened in the
world); and a kill between a write's intent and its completion was probed
to an answer (the demo refund's probe reads the ledger: found, it settles
the write; nothing, the write is performed again) or, where the probe cannot
tell (killed between sending the refund and recording its answer), parked the
run in needs_reconciliation for a person.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    EventKind,
    RunState,
    check_batch,
    decode_envelope,
    fold,
    sha256_hash,
)
from salvor.store import EventStore

from tests.support.cli import salvor_in_process
from tests.support.scripted_provider import ProviderCall, ScriptedProvider, tool_loop_script
from tests.support.spawn import salvor_process

pytestmark = pytest.mark.kill

# Commands no fault is aimed at, whose answer is what the test reads (the log, the replay, a
# person's resolve): main(argv) in this process (tests/support/cli). Every run and resume, the
# processes that are killed and the ones that recover, is a process of its own.
READS_AND_RECORDS = ("history", "replay", "resolve")
TIMEOUT = 60  # seconds a single salvor process may take before the test gives up on it

PLAN = [
    ("lookup_invoice", {"invoice_id": "INV-7"}),
    ("issue_refund", {"invoice_id": "INV-7", "amount_cents": 1250}),
    ("send_email", {"to": "a@example.com", "subject": "Refunded", "body": "Done"}),
]
TOOLS = [name for name, _ in PLAN]
FINAL_TEXT = "INV-7 refunded and the customer told."
RUN_INPUT = {"invoice_id": "INV-7"}
MODEL_CALLS = len(PLAN) + 1

_STEP = (
    EventKind.MODEL_CALL_REQUESTED,
    EventKind.MODEL_CALL_COMPLETED,
    EventKind.TOOL_CALL_REQUESTED,
    EventKind.TOOL_CALL_COMPLETED,
)
# The event kinds an uninterrupted run of PLAN records: a step per tool, then the final answer.
# Parametrisation needs them at collection time; test_clean_run checks them against a real run.
CLEAN_KINDS = (
    EventKind.RUN_STARTED,
    *_STEP * len(PLAN),
    *_STEP[:2],
    EventKind.RUN_COMPLETED,
)
EVENT_COUNT = len(CLEAN_KINDS)

# The last event of a commit: completions and observations are held back and
# committed together with the next intent (or the terminal event), so every
# commit ends with one of these.
COMMIT_ENDS = {
    EventKind.RUN_STARTED,
    EventKind.MODEL_CALL_REQUESTED,
    EventKind.TOOL_CALL_REQUESTED,
    EventKind.RUN_COMPLETED,
}

# Where a kill after seq N can land: the first seq of every commit. A kill after any later seq of
# the same commit dies at the same instant (right after that commit), so it is the same scenario;
# the first seq of a commit of several events also checks that the fault waits for the commit.
KILL_POINTS = [n for n in range(EVENT_COUNT) if n == 0 or CLEAN_KINDS[n - 1] in COMMIT_ENDS]
# The commit that makes the refund's intent durable (with the model answer held back before it).
_REFUND_INTENT = 1 + 4 * [tool for tool, _ in PLAN].index("issue_refund") + 2
WRITE_COMMIT = max(n for n in KILL_POINTS if n <= _REFUND_INTENT)

# Every kill point on SQLite; on PostgreSQL a sample (the head, the write's intent, the end; the
# first and last model call). A commit is as durable on either backend, and what a kill between
# two commits leaves behind is the recovery's to handle, which does not know the backend.
COMMIT_KILLS = [("sqlite", n) for n in KILL_POINTS] + [
    ("postgres", n) for n in (0, WRITE_COMMIT, KILL_POINTS[-1])
]
MODEL_KILLS = [("sqlite", k) for k in range(MODEL_CALLS)] + [
    ("postgres", k) for k in (0, MODEL_CALLS - 1)
]
# Inside a tool: every tool on SQLite; on PostgreSQL the write's two (its probe finds the refund;
# its probe cannot tell and the run parks): those read and settle a claim and a probe answer in
# the store, where a read's or an idempotent call's cut is recovered like a model call's.
TOOL_FAULTS = [*TOOLS, "issue_refund:sent"]
TOOL_KILLS = [("sqlite", t) for t in TOOL_FAULTS] + [
    ("postgres", t) for t in ("issue_refund", "issue_refund:sent")
]


# --------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """Where one salvor process dies: after seq N commits, inside model call k, or inside a tool."""

    where: str  # "seq" | "model" | "tool"
    at: int | str

    @property
    def label(self) -> str:
        return f"{self.where}-{self.at:02d}" if self.where == "seq" else f"{self.where}-{self.at}"


def after_seq(n: int) -> Fault:
    return Fault("seq", n)


def in_model_call(k: int) -> Fault:
    return Fault("model", k)


def in_tool(name: str) -> Fault:
    return Fault("tool", name)


# --------------------------------------------------------------------------
# The harness: provider, agent file, store, ledger, salvor processes
# --------------------------------------------------------------------------


def _tool_results(call: ProviderCall) -> int:
    """Which model call of the run this is: the number of tool results it carries."""
    return sum(
        1
        for message in call.request["messages"]
        for block in message["content"]
        if block["type"] == "tool_result"
    )


@dataclass
class Proc:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (
            f"`salvor {' '.join(self.args)}` exited {self.returncode}\n"
            f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}"
        )


@dataclass
class Recovery:
    """What recovering one run took."""

    resumes: int = 0
    kills: int = 0
    # (seq of the dangling write, whether the ledger showed it happened)
    reconciliations: list[tuple[int, bool]] = field(default_factory=list)


class Harness:
    """One run of the refund plan against one store, killed where a test says."""

    def __init__(self, tmp_path: Path, store_url: str) -> None:
        self.store_url = store_url
        self.run_id = str(uuid.uuid4())
        self.effects = tmp_path / "effects.jsonl"
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._model_fault: int | None = None
        # Request hashes of model calls the provider received and whose
        # caller it killed before answering: they were never completed.
        self.cut_hashes: list[str] = []
        # Tools a fault killed a process inside (each re-executes once on recovery).
        self.tool_kills: list[str] = []
        # Outputs a person recorded with `salvor resolve`, by the write's seq.
        self.resolved_outputs: dict[int, Any] = {}
        self.provider = ScriptedProvider(
            tool_loop_script(PLAN, final_text=FINAL_TEXT), on_call=self._on_call
        )
        self.agent = tmp_path / "refund.toml"
        tools = "".join(f'\n[[tools]]\nname = "{name}"\n' for name in TOOLS)
        self.agent.write_text(
            'model = "scripted"\n'
            "max_response_tokens = 256\n"
            "[llm]\n"
            'provider = "anthropic"\n'
            f'base_url = "{self.provider.base_url}"\n'
            "max_retries = 0\n"
            "timeout_seconds = 30\n" + tools,
            encoding="utf-8",
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
        env.update(
            SALVOR_STORE=store_url, SALVOR_DEMO_EFFECTS=str(self.effects), PYTHONUNBUFFERED="1"
        )
        self.env = env

    def close(self) -> None:
        self.provider.stop()

    def kills_in(self, tool: str) -> int:
        return self.tool_kills.count(tool)

    # -- the provider's hook (runs on a provider thread) ----------------------

    def _on_call(self, call: ProviderCall) -> None:
        if self._model_fault is None or _tool_results(call) != self._model_fault:
            return
        self._model_fault = None  # one kill per fault
        with self._lock:  # the child is registered before it can call anything
            child = self._child
        self.cut_hashes.append(call.request_hash)
        os.kill(child.pid, signal.SIGKILL)

    # -- salvor processes -------------------------------------------------------

    def salvor(self, *args: str, fault: Fault | None = None) -> Proc:
        if args[0] in READS_AND_RECORDS:
            assert fault is None, f"a fault is for a process of its own, not `salvor {args[0]}`"
            done = salvor_in_process(*args, env=self.env)
            return Proc(list(args), done.returncode, done.stdout, done.stderr)
        env = dict(self.env)
        if fault is not None and fault.where == "seq":
            env["SALVOR_FAULT_KILL_AFTER_SEQ"] = str(fault.at)
        elif fault is not None and fault.where == "tool":
            env["SALVOR_FAULT_KILL_IN_TOOL"] = fault.at
        elif fault is not None:
            self._model_fault = fault.at
        with self._lock:
            self._child = salvor_process(
                args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        child = self._child
        try:
            stdout, stderr = child.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
        finally:
            self._model_fault = None
        return Proc(list(args), child.returncode, stdout, stderr)

    def start(self, fault: Fault | None = None) -> Proc:
        return self.salvor(
            "run",
            str(self.agent),
            "--run-id",
            self.run_id,
            "--input",
            json.dumps(RUN_INPUT),
            fault=fault,
        )

    def history(self) -> list:
        proc = self.salvor("history", self.run_id, "--json")
        assert proc.returncode == 0, str(proc)
        return [decode_envelope(line) for line in proc.stdout.splitlines()]

    def stored(self) -> tuple[list, Any]:
        """The run's log and materialised view, read from the store in this process."""
        store = EventStore.open(self.store_url)
        try:
            return store.read_log(self.run_id), store.read_view(self.run_id)
        finally:
            store.close()

    def killed_log(self) -> list:
        """The log a killed process left, checked against the store's materialised view."""
        log, view = self.stored()
        assert view == fold(log), "the runs row and the log disagree after a kill"
        return log

    def replay(self) -> dict:
        proc = self.salvor("replay", self.run_id, "--dry-run")
        assert proc.returncode == 0, str(proc)
        return json.loads(proc.stdout)

    def probe_answers(self, seq: int) -> list:
        with EventStore.open(self.store_url) as store:
            return list(store.claims.probe_answers([(self.run_id, seq)]).values())

    def ledger(self, tool: str | None = None) -> list[dict]:
        if not self.effects.exists():
            return []
        records = [
            json.loads(line) for line in self.effects.read_text(encoding="utf-8").splitlines()
        ]
        return [
            r for r in records if r["run_id"] == self.run_id and (tool is None or r["tool"] == tool)
        ]

    # -- recovery as a person does it --------------------------------------------

    def recover(self, faults: list[Fault] = ()) -> Recovery:
        """``salvor resume`` until the run completes; ``salvor resolve`` each dangling write.

        ``faults`` kill the first resuming processes, one each.
        """
        faults = list(faults)
        recovery = Recovery()
        for _ in range(2 * len(faults) + 6):
            fault = faults.pop(0) if faults else None
            proc = self.salvor("resume", self.run_id, fault=fault)
            recovery.resumes += 1
            if proc.returncode == -signal.SIGKILL:
                assert fault is not None, f"a resume without a fault was killed\n{proc}"
                recovery.kills += 1
                continue
            if proc.returncode == 1:
                # Refused before driving anything: the fault waits for the next process.
                if fault is not None:
                    faults.insert(0, fault)
                self.reconcile(proc, recovery)
                continue
            assert proc.returncode == 0, str(proc)
            if f"run {self.run_id} needs reconciliation" in proc.stdout:
                # Driven to the write's probe, which could not tell: parked for a person
                # (a fault meant for this process never fired: it waits for the next one).
                if fault is not None:
                    faults.insert(0, fault)
                self.reconcile(proc, recovery)
                continue
            assert fault is None, f"the fault {fault} never fired\n{proc}"
            assert f"run {self.run_id} completed" in proc.stdout, str(proc)
            return recovery
        raise AssertionError(f"run {self.run_id} did not complete after {recovery.resumes} resumes")

    def reconcile(self, refused: Proc, recovery: Recovery) -> None:
        """A resume refused a dangling write: check the world, then record what happened."""
        replay = self.replay()
        assert replay["status"]["state"] == "needs_reconciliation", f"{refused}\nreplay: {replay}"
        pending = replay["pending"]
        assert pending["kind"] == "tool" and pending["effect"] == "write", replay
        # One sentence (a refusal's on stderr, a drive's report on stdout), naming the
        # command that clears it.
        message = (refused.stderr if refused.returncode else refused.stdout).strip()
        assert "\n" not in message and f"salvor resolve {self.run_id}" in message, str(refused)
        assert (refused.stdout if refused.returncode else refused.stderr) == "", str(refused)
        assert pending["tool"] == "issue_refund", replay
        done = [r for r in self.ledger("issue_refund") if r["seq"] == pending["seq"]]
        if done:
            output = {"refund_id": "rf_checked_by_hand", **pending["input"]}
        else:
            output = {"refunded": False, "note": "no refund found at the payment provider"}
        proc = self.salvor("resolve", self.run_id, "--output", json.dumps(output))
        assert proc.returncode == 0, str(proc)
        recovery.reconciliations.append((pending["seq"], bool(done)))
        self.resolved_outputs[pending["seq"]] = output


@pytest.fixture
def harness(tmp_path: Path, store_url: str):
    h = Harness(tmp_path, store_url)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(scope="module")
def clean_kinds(tmp_path_factory) -> list[EventKind]:
    """The event kinds of one uninterrupted run of PLAN (SQLite)."""
    tmp = tmp_path_factory.mktemp("clean")
    h = Harness(tmp, f"sqlite:///{tmp / 'salvor.db'}")
    try:
        proc = h.start()
        assert proc.returncode == 0, str(proc)
        return [envelope.event.KIND for envelope in h.history()]
    finally:
        h.close()


# --------------------------------------------------------------------------
# Invariants
# --------------------------------------------------------------------------


def assert_valid_prefix(log: list, clean_kinds: list[EventKind]) -> None:
    """A killed run's log: contiguous, legal, a prefix of a clean run, ending at a commit."""
    assert [e.seq for e in log] == list(range(len(log)))
    check_batch(EMPTY_VIEW, log)
    assert [e.event.KIND for e in log] == clean_kinds[: len(log)]
    assert log[-1].event.KIND in COMMIT_ENDS, f"a commit ended with {log[-1].event.KIND}"


def assert_invariants(h: Harness, clean_kinds: list[EventKind], recovery: Recovery) -> list:
    log = h.history()

    # (a) contiguous from 0, and every event legal after the ones before it.
    assert [e.seq for e in log] == list(range(len(log)))
    assert all(e.run_id == h.run_id for e in log)
    view = check_batch(EMPTY_VIEW, log)

    # (b) completed, with the log an uninterrupted run writes.
    assert view.state is RunState.COMPLETED, view.status()
    assert view.detail["output"] == FINAL_TEXT
    assert [e.event.KIND for e in log] == clean_kinds
    assert view.step_count == MODEL_CALLS

    # (c) no completed model call served twice: every request the log asked
    # for was served once, plus once more when a kill cut it off unanswered.
    requested = [
        e.event.request_hash for e in log if e.event.KIND is EventKind.MODEL_CALL_REQUESTED
    ]
    completed = [e for e in log if e.event.KIND is EventKind.MODEL_CALL_COMPLETED]
    assert len(requested) == len(completed) == MODEL_CALLS
    assert len(set(requested)) == MODEL_CALLS
    served = h.provider.count_by_request_hash()
    cut = Counter(h.cut_hashes)
    expected = (
        Counter({request_hash.removeprefix("sha256:"): 1 for request_hash in requested}) + cut
    )
    assert served == expected, f"served {dict(served)}, expected {dict(expected)}"
    assert h.provider.call_count == len(completed) + len(h.cut_hashes)

    # (d) no completed tool call's effect happened twice in the world.
    intents = {e.event.tool: e for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED}
    assert sorted(intents) == sorted(TOOLS)
    completions = {
        e.event.seq: e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED
    }

    lookups = h.ledger("lookup_invoice")
    assert len(lookups) == 1 + h.kills_in("lookup_invoice"), lookups
    assert all(r["seq"] == intents["lookup_invoice"].seq for r in lookups)

    refunds = h.ledger("issue_refund")
    assert len(refunds) <= 1, refunds
    refund_intent = intents["issue_refund"]
    refund_done = completions[refund_intent.seq]
    if refund_intent.seq in h.resolved_outputs:
        # Settled by a person, with exactly what they recorded.
        assert refund_done.settled_by == "operator"
        assert refund_done.output == h.resolved_outputs[refund_intent.seq]
        happened = dict(recovery.reconciliations)[refund_intent.seq]
        assert len(refunds) == int(happened)
    elif refund_done.settled_by == "probe":
        # Its probe found the refund in the world: that refund is the write's output.
        assert len(refunds) == 1 and refund_done.output == refunds[0]["refund"]
        assert refund_done.probe["tool"] == "lookup_refund"
    else:
        assert refund_done.settled_by is None
        assert len(refunds) == 1

    emails = h.ledger("send_email")
    key = intents["send_email"].event.idempotency_key
    assert key == sha256_hash(
        {"run": h.run_id, "seq": intents["send_email"].seq, "tool": "send_email"}
    )
    assert len(emails) == 1 + h.kills_in("send_email"), emails
    assert all(r["idempotency_key"] == key for r in emails), (key, emails)
    assert [r["delivered"] for r in emails] == [True] + [False] * (len(emails) - 1)

    # The store's materialised view (updated with every append, across the
    # killed processes) agrees with the fold of the log.
    stored_log, stored_view = h.stored()
    assert stored_log == log
    assert stored_view == fold(log) == view
    return log


def run_scenario(
    h: Harness, faults: list[Fault], clean_kinds: list[EventKind]
) -> tuple[list, list, Recovery]:
    """Start the run under ``faults[0]``, recover under the rest, check every invariant.

    Returns the log as the first kill left it, the final log, and what recovery took.
    """
    h.tool_kills = [f.at for f in faults if f.where == "tool"]
    first, rest = faults[0], faults[1:]
    proc = h.start(fault=first)
    assert proc.returncode == -signal.SIGKILL, str(proc)
    printed = proc.stdout.split()
    if first == after_seq(0):
        assert printed == [], "the run id was printed before the run existed"
    else:
        assert printed[:1] == [h.run_id], str(proc)  # printed as soon as the run exists
    killed = h.killed_log()
    assert_valid_prefix(killed, clean_kinds)
    recovery = h.recover(rest)
    assert recovery.kills == len(rest)
    log = assert_invariants(h, clean_kinds, recovery)
    return killed, log, recovery


def _commit_end(n: int, kinds: list[EventKind]) -> int:
    """The last seq of the commit that makes seq ``n`` durable."""
    return next(m for m in range(n, len(kinds)) if kinds[m] in COMMIT_ENDS)


# --------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------


def test_clean_run(harness: Harness, clean_kinds: list[EventKind]) -> None:
    """The baseline: an uninterrupted run, and the events the seq scenarios cover."""
    assert clean_kinds == list(CLEAN_KINDS), clean_kinds
    proc = harness.start()
    assert proc.returncode == 0, str(proc)
    assert proc.stdout.splitlines()[0] == harness.run_id
    assert_invariants(harness, clean_kinds, Recovery())


@pytest.mark.parametrize(
    ("store_url", "n"),
    COMMIT_KILLS,
    indirect=["store_url"],
    ids=[f"{backend}-seq-{n:02d}" for backend, n in COMMIT_KILLS],
)
def test_kill_after_every_commit(harness: Harness, clean_kinds: list[EventKind], n: int) -> None:
    """SIGKILL right after the commit that made seq n durable, then recover."""
    killed, log, recovery = run_scenario(harness, [after_seq(n)], clean_kinds)
    # The process died right after that commit: nothing later was recorded.
    assert killed[-1].seq == _commit_end(n, clean_kinds)
    # Dying right after a write's intent committed (before the write could
    # start) leaves an open write its probe finds did not land: the resume
    # performs it, once. Nothing needs a person.
    assert recovery.reconciliations == []
    refund = next(
        e
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED and e.event.tool == "issue_refund"
    )
    if killed[-1].seq == refund.seq:
        [answer] = harness.probe_answers(refund.seq)
        assert answer.verdict == "not_landed"
        assert len(harness.ledger("issue_refund")) == 1
    assert harness.cut_hashes == []  # no model call was in flight at a commit boundary


@pytest.mark.parametrize(
    ("store_url", "k"),
    MODEL_KILLS,
    indirect=["store_url"],
    ids=[f"{backend}-model-{k}" for backend, k in MODEL_KILLS],
)
def test_kill_inside_model_call(harness: Harness, clean_kinds: list[EventKind], k: int) -> None:
    """SIGKILL while model call k is in flight (the provider has it, the answer is lost)."""
    killed, log, recovery = run_scenario(harness, [in_model_call(k)], clean_kinds)
    assert len(harness.cut_hashes) == 1
    last = killed[-1]
    assert last.event.KIND is EventKind.MODEL_CALL_REQUESTED
    assert last.event.request_hash == "sha256:" + harness.cut_hashes[0]
    # The cut call is the k-th model call of the run, re-issued under its own seq.
    requested = [e for e in log if e.event.KIND is EventKind.MODEL_CALL_REQUESTED]
    assert requested[k].seq == last.seq
    assert recovery.reconciliations == [] and recovery.resumes == 1


@pytest.mark.parametrize(
    ("store_url", "tool"),
    TOOL_KILLS,
    indirect=["store_url"],
    ids=[f"{backend}-tool-{t}" for backend, t in TOOL_KILLS],
)
def test_kill_inside_tool(harness: Harness, clean_kinds: list[EventKind], tool: str) -> None:
    """SIGKILL inside a tool, after its effect and before its completion is recorded."""
    h = harness
    h.tool_kills.append(tool)
    proc = h.start(fault=in_tool(tool))
    assert proc.returncode == -signal.SIGKILL, str(proc)
    killed = h.killed_log()
    assert_valid_prefix(killed, clean_kinds)
    last = killed[-1].event
    # (A fault point inside a tool names it before a colon: `issue_refund:sent`.)
    assert last.KIND is EventKind.TOOL_CALL_REQUESTED and last.tool == tool.split(":")[0]
    assert len(h.ledger(tool)) == 1  # the effect happened; its completion was never recorded

    replay = h.replay()
    if tool.startswith("issue_refund"):
        # (e) an interrupted write is never guessed at.
        assert replay["status"]["state"] == "needs_reconciliation"
        assert replay["pending"]["effect"] == "write"
        assert replay["pending"]["seq"] == killed[-1].seq
    else:
        assert replay["status"]["state"] == "awaiting_tool"
        assert replay["pending"]["effect"] == ("read" if tool == "lookup_invoice" else "idempotent")

    recovery = h.recover()
    if tool == "issue_refund":
        # Its probe found the refund: settled by the first resume, nobody asked.
        assert recovery.reconciliations == [] and recovery.resumes == 1
        [answer] = h.probe_answers(killed[-1].seq)
        assert answer.verdict == "landed"
    elif tool == "issue_refund:sent":
        # Sent, never answered: the probe cannot tell, so a person resolved it.
        assert recovery.reconciliations == [(killed[-1].seq, False)]
        assert recovery.resumes == 2  # parked by the probe once, then completed after resolve
        [answer] = h.probe_answers(killed[-1].seq)
        assert answer.verdict == "unknown" and answer.answer["found"] is None
    else:
        assert recovery.reconciliations == [] and recovery.resumes == 1
    assert_invariants(h, clean_kinds, recovery)


COMPOUND = [
    # The recovering processes die too.
    [in_model_call(1), in_tool("send_email")],
    [after_seq(3), after_seq(9), in_model_call(3)],
    [in_tool("lookup_invoice"), in_tool("send_email"), after_seq(EVENT_COUNT - 1)],
    # A write left dangling, settled by its probe, and the process after the probe dies.
    [in_tool("issue_refund"), in_model_call(2)],
    # The probe's own process dies inside the probe; the next one probes again.
    [in_tool("issue_refund"), in_tool("lookup_refund")],
]


# Every sequence on SQLite; on PostgreSQL the two that kill the most processes in turn: three
# kills of three kinds, and the probe's own process killed inside the probe (its answer is the
# store's to keep across the kill).
_ON_POSTGRES = (1, 4)
COMPOUND_KILLS = [("sqlite", faults) for faults in COMPOUND] + [
    ("postgres", COMPOUND[i]) for i in _ON_POSTGRES
]


@pytest.mark.parametrize(
    ("store_url", "faults"),
    COMPOUND_KILLS,
    indirect=["store_url"],
    ids=[f"{backend}-" + "+".join(f.label for f in fs) for backend, fs in COMPOUND_KILLS],
)
def test_kills_during_recovery(
    harness: Harness, clean_kinds: list[EventKind], faults: list[Fault]
) -> None:
    """Several kills in a row: the run, then the processes recovering it."""
    _killed, _log, recovery = run_scenario(harness, faults, clean_kinds)
    assert len(harness.cut_hashes) == sum(1 for f in faults if f.where == "model")
    # The refund killed mid-call is found by its probe: nobody is asked.
    assert recovery.reconciliations == []
