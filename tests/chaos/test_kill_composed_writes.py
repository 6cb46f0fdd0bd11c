"""A keyed, probed write of a composed run's child, cut between its intent and its effect, is
performed once after a restart.

The daemon dies inside ``issue_refund`` right after the child's intent is durable and before
anything was sent (the demo tools' ``issue_refund:before`` fault point). On the restart the
child's write is open and its probe says it did not land, so it is performed again: once. Before
the one-driver rule, two drivers ran the child after the restart (its parent's walk, and a
recovery drive of its own), both probed "not landed" and both refunded: the ledger showed two
refunds in most tries. Each case runs several times, since the race was a race.

A subagent's child (the parent calls ``subagent``) and a map item's child (a graph's ``map``
node) are the two ways one run drives another.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS
from tests.chaos.test_kill_serve import Daemon
from tests.support.runtime import ledger

pytestmark = pytest.mark.kill

TRIES = 4
REFUNDER = """
name = "refunder"
model = "demo-planner"
system_prompt = "Look the invoice up and refund it."
[llm]
provider = "demo"
[[tools]]
name = "lookup_invoice"
[[tools]]
name = "issue_refund"
"""
DELEGATOR = """
name = "delegator"
model = "demo-planner"
system_prompt = "Hand the refund to the refunder."
flow_tools = ["subagent"]
[llm]
provider = "demo"
"""


def register(client: httpx.Client, toml: str) -> str:
    response = client.post("/v1/agents", content=toml, headers={"Content-Type": "application/toml"})
    assert response.status_code == 201, response.text
    return response.json()["agent"]


def rest(client: httpx.Client, run_id: str) -> dict:
    """The run's body once it rests with no driver attached."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        body = client.get(f"/v1/runs/{run_id}").json()
        if body["status"]["state"] != "running" and body.get("driver") != "attached":
            return body
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} never came to rest: {body}")


def refunds(effects: Path) -> list[dict]:
    return [r for r in ledger(effects) if r["tool"] == "issue_refund"]


def killed_in_the_write_then_restarted(tmp_path: Path, store_url: str, start) -> tuple:
    """Start a run with ``start(client)``; the daemon dies in the child's write; restart it.

    Returns the run's body at rest and the refunds the ledger holds.
    """
    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, store_url, effects)
    daemon.env["SALVOR_FAULT_KILL_IN_TOOL"] = "issue_refund:before"
    daemon.start()
    try:
        client = httpx.Client(base_url=daemon.base_url, timeout=30)
        run_id = start(client)
        assert daemon.proc.wait(timeout=SETTLE_SECONDS) == -9  # the fault point's SIGKILL
        assert refunds(effects) == []
        del daemon.env["SALVOR_FAULT_KILL_IN_TOOL"]
        daemon.start()
        body = rest(client, run_id)
        client.close()
    finally:
        daemon.kill()
    return body, refunds(effects)


@pytest.mark.parametrize("attempt", range(TRIES))
def test_a_subagent_child_s_write_cut_before_its_effect_is_performed_once(
    tmp_path: Path, store_url: str, attempt: int
) -> None:
    def start(client: httpx.Client) -> str:
        register(client, REFUNDER)
        delegator = register(client, DELEGATOR)
        task = {"agent": "refunder", "task": "refund INV-7001", "inputs": {}}
        started = client.post("/v1/runs", json={"agent": delegator, "input": task})
        assert started.status_code == 201, started.text
        return started.json()["run"]

    body, done = killed_in_the_write_then_restarted(tmp_path, store_url, start)
    assert body["status"]["state"] == "completed", body
    assert len(done) == 1, done


@pytest.mark.parametrize("attempt", range(TRIES))
def test_a_map_item_child_s_write_cut_before_its_effect_is_performed_once(
    tmp_path: Path, store_url: str, attempt: int
) -> None:
    def start(client: httpx.Client) -> str:
        refunder = register(client, REFUNDER)
        document = {
            "schema_version": 1,
            "nodes": [
                {
                    "id": "each",
                    "kind": "map",
                    "over": "$input",
                    "body": {"kind": "agent", "agent": refunder, "input": "$item"},
                }
            ],
            "edges": [],
        }
        graph = client.post("/v1/graphs", json=document).json()["graph"]
        items = [{"invoice_id": "INV-7002"}]
        started = client.post("/v1/graph-runs", json={"graph_hash": graph, "input": items})
        assert started.status_code == 201, started.text
        return started.json()["run"]

    body, done = killed_in_the_write_then_restarted(tmp_path, store_url, start)
    assert body["status"]["state"] == "completed", body
    assert len(done) == 1, done
