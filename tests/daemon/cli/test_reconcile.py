"""`salvor reconcile`: the reconciliation queue on the command line, listed and worked one run at
a time, over a real store (the scripted provider the only double): each command's answer read
from ``main(argv)`` in the test's process, each killed run a real subprocess.

Each parked run is a real one: `salvor run` killed inside ``issue_refund`` once the refund was
sent (``SALVOR_FAULT_KILL_IN_TOOL=issue_refund:sent``), so its log ends at the write's open
intent and its probe cannot tell whether it landed.
"""

from __future__ import annotations

import json

import pytest
from salvor.protocol import TOOL_ERROR_KEY, EventKind
from salvor.store import EventStore

from tests.daemon.cli.test_cli import event_total, one_sentence, salvor, salvor_process
from tests.support.backends import SQLITE_ONLY
from tests.support.runtime import agent_toml, ledger
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is the command's sentences and exits;
# the queue's store query is tests/store's, on both backends.
STORE_BACKENDS = SQLITE_ONLY

NOBODY = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def refund_file(tmp_path, providers):
    """An agent file refunding one invoice (each invoice is its own identity: a run refunding an
    invoice another run refunded copies that refund instead of reaching the tool)."""

    def made(invoice: str = "INV-9"):
        provider = providers(
            tool_loop_script(
                [("issue_refund", {"invoice_id": invoice, "amount_cents": 300})],
                final_text="settled",
            )
        )
        path = tmp_path / f"agent-{invoice}.toml"
        path.write_text(agent_toml(provider.base_url, tools=["issue_refund"]))
        return path

    return made


@pytest.fixture
def effects(tmp_path):
    return tmp_path / "effects.jsonl"


def killed_in_the_refund(store_url, agent_file, effects, *labels: str) -> str:
    # Killed once the bank was sent the refund, before it answered: the refund's probe
    # (lookup_refund) cannot tell whether it landed, so the run stays parked for a person.
    env = {"SALVOR_FAULT_KILL_IN_TOOL": "issue_refund:sent", "SALVOR_DEMO_EFFECTS": str(effects)}
    args = [a for label in labels for a in ("--label", label)]
    killed = salvor_process(store_url, "run", str(agent_file), "--json", *args, env=env)
    assert killed.returncode == -9, killed.stderr
    return json.loads(killed.stdout.splitlines()[0])["run"]


def last_event(store_url: str, run_id: str):
    with EventStore.open(store_url) as store:
        return store.read_log(run_id)[-1].event


def test_the_queue_is_listed_oldest_first_readably_and_as_json_lines(
    store_url, refund_file, effects
):
    completes = salvor(store_url, "run", str(refund_file("INV-1")))
    assert completes.returncode == 0  # not listed
    first = killed_in_the_refund(store_url, refund_file(), effects, "desk=eu")
    second = killed_in_the_refund(store_url, refund_file("INV-10"), effects)

    listed = salvor(store_url, "reconcile", "--json")
    assert listed.returncode == 0, listed.stderr
    items = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [item["run"] for item in items] == [first, second]
    assert items[0]["labels"] == {"desk": "eu"} and items[0]["probe"] is None
    assert items[0]["intent"]["tool"] == "issue_refund"
    assert items[0]["resolve"] == {
        "path": f"/v1/runs/{first}/resolve",
        "performed_by": "salvor",
        "output_schema": None,
        "require_equal": {},
    }
    runs = {r["run"]: r for r in json.loads(salvor(store_url, "runs", "--json").stdout)["runs"]}
    assert items[0]["agent"] == runs[first]["agent_def_hash"]

    readable = salvor(store_url, "reconcile")
    assert readable.returncode == 0, readable.stderr
    blocks = readable.stdout.strip().split("\n\n")
    assert [block.splitlines()[0].split()[1] for block in blocks] == [first, second]
    block = blocks[0]
    seq = items[0]["intent"]["seq"]
    for fragment in (
        "(desk=eu)",
        f"since   {items[0]['parked_since']}",
        f"issue_refund at seq {seq} (performed by salvor)",
        '"invoice_id": "INV-9"',
        f"salvor reconcile {first} --output JSON",
        f"salvor reconcile {first} --not-landed",
    ):
        assert fragment in block, block

    # A resume probes the write first; the probe cannot tell, and the queue shows its answer.
    resumed = salvor(store_url, "resume", first, env={"SALVOR_DEMO_EFFECTS": str(effects)})
    assert resumed.returncode == 0 and "needs reconciliation" in resumed.stdout, resumed.stderr
    listed = salvor(store_url, "reconcile", "--json")
    probe = json.loads(listed.stdout.splitlines()[0])["probe"]
    assert (probe["tool"], probe["verdict"]) == ("lookup_refund", "unknown"), probe
    block = salvor(store_url, "reconcile").stdout.split("\n\n")[0]
    assert "probe   lookup_refund answered" in block and "(could not tell)" in block, block


def test_an_output_resolves_the_write_and_the_run_continues(store_url, refund_file, effects):
    run_id = killed_in_the_refund(store_url, refund_file(), effects)
    done = salvor(store_url, "reconcile", run_id, "--output", '{"refund_id": "rf_1"}')
    assert done.returncode == 0, done.stderr
    assert "write resolved" in done.stdout and f"salvor resume {run_id}" in done.stdout
    completion = last_event(store_url, run_id)
    assert completion.output == {"refund_id": "rf_1"} and completion.settled_by == "operator"
    assert salvor(store_url, "reconcile", "--json").stdout == ""
    resumed = salvor(store_url, "resume", run_id)
    assert resumed.returncode == 0 and "completed" in resumed.stdout
    # The killed attempt reached the bank once and nothing answered it: resolving performed
    # nothing more.
    assert [e["tool"] for e in ledger(effects)] == ["issue_refund:sent"]


def test_not_landed_records_a_failed_call_the_model_is_told(store_url, refund_file, effects):
    run_id = killed_in_the_refund(store_url, refund_file(), effects)
    seq = json.loads(salvor(store_url, "reconcile", "--json").stdout)["intent"]["seq"]
    done = salvor(store_url, "reconcile", run_id, "--not-landed", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resolved"] is True
    completion = last_event(store_url, run_id)
    assert completion.KIND is EventKind.TOOL_CALL_COMPLETED and completion.seq == seq
    assert completion.settled_by == "operator" and completion.deduplicated_from is None
    error = completion.output[TOOL_ERROR_KEY]
    assert error["kind"] == "not_landed" and "did not happen" in error["message"]
    resumed = salvor(store_url, "resume", run_id)
    assert resumed.returncode == 0 and "completed" in resumed.stdout
    log = salvor(store_url, "log", run_id).stdout
    assert "error: a person checked" in log and "[Operator]" in log


def test_each_refusal_is_one_sentence_and_records_nothing(store_url, refund_file, effects):
    run_id = killed_in_the_refund(store_url, refund_file(), effects)
    completed = salvor(store_url, "run", str(refund_file("INV-1"))).stdout.splitlines()[0]
    before = event_total(store_url)
    usage = 2  # a flag the command cannot start with
    for args, fragments, exit in (
        ([run_id], ["exactly one of --output JSON", "--not-landed"], usage),
        ([run_id, "--output", "{}", "--not-landed"], ["exactly one of --output JSON"], usage),
        (["--not-landed"], ["name it"], usage),
        (["--output", "{}"], ["name it"], usage),
        ([run_id, "--output", "nope"], ["--output is not valid JSON"], usage),
        ([completed, "--not-landed"], ["no dangling write to resolve", "completed"], 1),
        ([completed, "--output", "{}"], ["no dangling write to resolve"], 1),
        ([NOBODY, "--not-landed"], [f"no run {NOBODY}"], 1),
        (["run-1", "--not-landed"], ["not a run id"], usage),
    ):
        one_sentence(salvor(store_url, "reconcile", *args), *fragments, exit=exit)
    assert event_total(store_url) == before
