"""A probed write across SIGKILLs: a real `salvor run`, the demo tools' ledger, a real store.

The demo ``issue_refund`` is keyed on its invoice and probed by
``lookup_refund``, a read of the ledger the refunds are written to. The
first `salvor run` is SIGKILLed inside the refund (after it reached the
ledger, before its completion was recorded); the first `salvor resume` is
SIGKILLed inside the probe, which writes nothing to the log. The next resume
probes again, finds the refund, and settles the write with it. A second run
refunding the same invoice copies that outcome. Through it all the ledger
holds one refund per invoice.

A run killed after the bank was sent the refund, before its answer was
recorded, cannot be told apart by the probe: it parks for a person, with the
probe's answer kept for the queue; and so does one whose recovery has no
ledger to look in.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from salvor.protocol import EventKind, RunState, sha256_hash
from salvor.store import EventStore

from tests.support.cli import salvor_in_process
from tests.support.runtime import ledger as read_ledger
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script
from tests.support.spawn import run_salvor

pytestmark = pytest.mark.kill

# What the test reads or records as a person would (the log, a resolve), no fault aimed at it:
# main(argv) in this process (tests/support/cli). Every run and resume is a process of its own.
READS_AND_RECORDS = ("log", "resolve")
TIMEOUT = 60


def agent_file(path: Path, provider: ScriptedProvider) -> Path:
    path.write_text(
        'model = "scripted"\n[llm]\nprovider = "anthropic"\n'
        f'base_url = "{provider.base_url}"\nmax_retries = 0\n\n'
        '[[tools]]\nname = "issue_refund"\n',
        encoding="utf-8",
    )
    return path


def refund_provider(invoice: str) -> ScriptedProvider:
    return ScriptedProvider(
        tool_loop_script(
            [("issue_refund", {"invoice_id": invoice, "amount_cents": 1250})], final_text="done"
        )
    )


def ledger(path: Path, tool: str) -> list[dict]:
    return [record for record in read_ledger(path) if record["tool"] == tool]


def the_refund(log):
    [intent] = [
        e
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED and e.event.tool == "issue_refund"
    ]
    done = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    return intent, (done[0] if done else None)


@pytest.fixture
def salvor(store_url, tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
    base.update(SALVOR_STORE=store_url, PYTHONUNBUFFERED="1", SALVOR_CLAIM_WAIT_SECONDS="0.3")

    def run(*args: str, **env: str) -> subprocess.CompletedProcess:
        if args[0] in READS_AND_RECORDS:
            return salvor_in_process(*args, env={**base, **env})
        return run_salvor(
            args,
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )

    return run


def test_a_write_and_its_probe_killed_in_turn_are_settled_once_by_the_next_probe(
    tmp_path: Path, store_url: str, salvor
) -> None:
    effects = str(tmp_path / "effects.jsonl")
    first_provider, second_provider = refund_provider("INV-7"), refund_provider("INV-7")
    try:
        first, second = str(uuid.uuid4()), str(uuid.uuid4())
        first_agent = agent_file(tmp_path / "first.toml", first_provider)
        second_agent = agent_file(tmp_path / "second.toml", second_provider)

        killed = salvor(
            "run",
            str(first_agent),
            "--run-id",
            first,
            SALVOR_DEMO_EFFECTS=effects,
            SALVOR_FAULT_KILL_IN_TOOL="issue_refund",
        )
        assert killed.returncode == -signal.SIGKILL, killed
        assert len(ledger(Path(effects), "issue_refund")) == 1

        # Killed inside the probe: nothing was written, the write is still open.
        with EventStore.open(store_url) as store:
            before = store.read_log(first)
        probing = salvor(
            "resume", first, SALVOR_DEMO_EFFECTS=effects, SALVOR_FAULT_KILL_IN_TOOL="lookup_refund"
        )
        assert probing.returncode == -signal.SIGKILL, probing
        with EventStore.open(store_url) as store:
            assert store.read_log(first) == before
            assert store.read_view(first).state is RunState.NEEDS_RECONCILIATION

        # The next recovery probes to an answer: the refund landed, and is the write's output.
        done = salvor("resume", first, SALVOR_DEMO_EFFECTS=effects)
        assert done.returncode == 0 and "completed" in done.stdout, done
        [refund] = ledger(Path(effects), "issue_refund")
        with EventStore.open(store_url) as store:
            intent, completion = the_refund(store.read_log(first))
            answers = store.claims.probe_answers([(first, intent.seq)])
        identity = sha256_hash({"tool": "issue_refund", "invoice_id": "INV-7"})
        assert intent.event.idempotency_key == identity
        assert completion.settled_by == "probe" and completion.output == refund["refund"]
        assert completion.probe["tool"] == "lookup_refund"
        assert completion.probe["input"] == {"invoice_id": "INV-7"}
        assert answers[(first, intent.seq)].verdict == "landed"
        tagged = [line for line in salvor("log", first).stdout.splitlines() if "[Probe" in line]
        assert len(tagged) == 1 and "ToolCallCompleted" in tagged[0]
        assert tagged[0].endswith("[Probe lookup_refund]")

        # Another run refunding the same invoice performs nothing: it copies the settled outcome.
        again = salvor("run", str(second_agent), "--run-id", second, SALVOR_DEMO_EFFECTS=effects)
        assert again.returncode == 0 and "completed" in again.stdout, again
        with EventStore.open(store_url) as store:
            _, copied = the_refund(store.read_log(second))
        assert copied.deduplicated_from == {"run_id": first, "seq": intent.seq}
        assert copied.output == refund["refund"]
        assert len(ledger(Path(effects), "issue_refund")) == 1
    finally:
        first_provider.stop()
        second_provider.stop()


def test_a_probe_that_cannot_tell_parks_the_killed_write_for_a_person(
    tmp_path: Path, store_url: str, salvor
) -> None:
    effects = str(tmp_path / "effects.jsonl")
    provider = refund_provider("INV-8")
    try:
        run_id = str(uuid.uuid4())
        agent = agent_file(tmp_path / "agent.toml", provider)
        killed = salvor(
            "run",
            str(agent),
            "--run-id",
            run_id,
            SALVOR_DEMO_EFFECTS=effects,
            SALVOR_FAULT_KILL_IN_TOOL="issue_refund:sent",
        )
        assert killed.returncode == -signal.SIGKILL, killed
        assert len(ledger(Path(effects), "issue_refund:sent")) == 1
        assert ledger(Path(effects), "issue_refund") == []

        # Sent, never answered: the probe cannot tell, so a person must.
        for environment in ({"SALVOR_DEMO_EFFECTS": effects}, {"SALVOR_DEMO_EFFECTS": ""}):
            parked = salvor("resume", run_id, **environment)
            assert parked.returncode == 0 and "needs reconciliation" in parked.stdout, parked
            with EventStore.open(store_url) as store:
                assert store.read_view(run_id).state is RunState.NEEDS_RECONCILIATION
                intent, completion = the_refund(store.read_log(run_id))
                answer = store.claims.probe_answers([(run_id, intent.seq)])[(run_id, intent.seq)]
            assert completion is None and ledger(Path(effects), "issue_refund") == []
            assert (answer.tool, answer.verdict, answer.error) == ("lookup_refund", "unknown", None)
            assert answer.answer["found"] is None
        # The last answer kept is the one without a ledger.
        assert "no effect ledger" in answer.answer["note"]
    finally:
        provider.stop()
