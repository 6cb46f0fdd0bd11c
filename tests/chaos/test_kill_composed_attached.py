"""Kill safety of a tool attached at run time and called by a tree's children: a real `salvor
serve` keeps roots of run trees in flight, each of which the workload gives the keyed, probed
demo ``issue_refund`` (``POST /v1/runs/{id}/tools``) while it waits on the workload, before it
starts any child, and is stopped at random instants (``composed_harness``'s stops, a kill inside
a refund among them).

The ``refunder`` agent declares ``lookup_invoice`` alone: every refund is the attached tool,
offered to it because its run inherited the attachment. The roots:

* a subagent tree: a ``delegator`` asks a question first (``ask_user``); the workload attaches
  ``issue_refund`` to it and answers; its ``subagent`` calls then start a refunder for each of
  its 1-3 invoices (a child session is offered no ``subagent``: a tree is one level deep);
* a graph run: a ``gate`` first, at which the workload attaches the tool and approves; then a
  ``map`` of refunder children (one per invoice), then a refunder agent node in the graph run
  itself.

Beyond the refund workload's invariants (logs contiguous and legal, each map item's child once,
at most one refund per invoice in the bank's ledger, every refund a log records done the bank's
one, nothing done by hand): every child's head inherited the attachment (``salvor.tools`` names
``issue_refund``), every root that started a child or refunded recorded the attachment, and no
refund answered an error (the tool was offered where it was called). At the end every
invoice of a tree that completed was refunded, and every tree completed, or rests with an
attached refund parked for a person (whether recovery probes an attached write or parks it open,
a parked one is a rest state) and its tree's other unfinished runs waiting on it.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from salvor.protocol import TOOL_ERROR_KEY, EventKind
from salvor.store import EventStore

from tests.chaos.composed_harness import MAP_NODE, SEED, Member, Root, kill_schedule, run_composed
from tests.chaos.composed_refunds import FINAL_TEXT, Composed, refund_steps
from tests.chaos.test_kill_serve import agent_toml, step_reply
from tests.support.scripted_provider import ProviderCall, Reply

pytestmark = pytest.mark.kill

ATTACHED = "issue_refund"
QUESTION = {"question": "Go ahead?", "type": "input"}
TOOLS_LABEL = "salvor.tools"


def attached_script(call: ProviderCall) -> Reply:
    """The refund workload's steps, after a question when the run's input says ``ask``."""
    work = json.loads(call.request["messages"][0]["content"][0]["text"])
    work = work.get("inputs", work)
    steps = refund_steps(work)
    if work.get("ask"):
        steps = [["ask_user", QUESTION], *steps]
    return step_reply(call, steps, final=FINAL_TEXT)


def attached_graph(refunder: str) -> dict:
    """Wait at a gate (the attachment lands there), refund every item (a map of refunder
    children), then refund one more invoice in the graph run itself."""
    return {
        "schema_version": 1,
        "nodes": [
            {"id": "approve", "kind": "gate", "prompt": "Refund these?"},
            {
                "id": MAP_NODE,
                "kind": "map",
                "over": "$input.items",
                "concurrency": 2,
                "body": {"kind": "agent", "agent": refunder, "input": "$item"},
            },
            {"id": "extra", "kind": "agent", "agent": refunder, "input": "$input.extra"},
        ],
        "edges": [{"from": "approve", "to": MAP_NODE}, {"from": MAP_NODE, "to": "extra"}],
    }


class ComposedAttached(Composed):
    """The refund workload with ``issue_refund`` attached to each root instead of declared."""

    def __init__(self, tmp_path: Path, store_url: str, seed: int) -> None:
        super().__init__(tmp_path, store_url, seed, script=attached_script)
        self.attached: set[str] = set()  # roots whose attachment was answered 200
        self.children = 0  # child runs found inheriting the attachment, at the end

    def register(self) -> None:
        base = self.provider.base_url
        hashes = []
        for toml in (
            agent_toml(base, "refunder", ["lookup_invoice"]),
            agent_toml(base, "delegator", [], ["subagent", "ask_user"]),
        ):
            response = self.http.post(
                "/v1/agents", content=toml, headers={"content-type": "application/toml"}
            )
            assert response.status_code == 201, response.text
            hashes.append(response.json()["agent"])
        self.refunder, self.agent = hashes
        response = self.http.post("/v1/graphs", json=attached_graph(self.refunder))
        assert response.status_code == 201, response.text
        self.graph = response.json()["graph"]

    def draw_root(self, case: str) -> Root:
        if self.rng.random() < 0.5:
            items = [{"invoice_id": f"INV-{case}-{i}"} for i in range(self.rng.randint(1, 3))]
            run_input = {"items": items, "extra": {"invoice_id": f"INV-{case}-x"}}
            return Root(case, "graph", run_input, answer={"approved": True})
        invoices = " ".join(f"INV-{case}-{i}" for i in range(self.rng.randint(1, 3)))
        inputs = {"invoices": invoices, "ask": True}
        run_input = {"task": "delegate", "inputs": inputs}
        return Root(case, "tree", run_input, answer={"answer": "go"}, run_id=str(uuid.uuid4()))

    def answer(self, root: Root) -> None:
        """Attach the tool (again after a stop: a tool the run has records nothing), then
        answer; a root a drive still holds is tried on a later round."""
        response = self.call("POST", f"/v1/runs/{root.run_id}/tools", json={"tools": [ATTACHED]})
        if response is None or response.status_code != 200:
            return
        self.attached.add(root.case)
        super().answer(root)

    def check_log(self, where: str, member: Member, view: Any, refunds, *, final: bool) -> None:
        """The refund workload's checks; a child inherited the attachment, a root recorded it,
        and no refund answered an error."""
        super().check_log(where, member, view, refunds, final=final)
        log = member.log
        if member.parent is not None:
            labels = log[0].event.labels or {}
            if ATTACHED not in (labels.get(TOOLS_LABEL) or "").split(","):
                self.violation(f"{where}: its head's tools are {labels.get(TOOLS_LABEL)!r}")
            self.children += final
        else:
            attached = [e.event.tools for e in log if e.event.KIND is EventKind.TOOLS_ATTACHED]
            acted = [
                e
                for e in log
                if e.event.KIND is EventKind.MAP_ITEM_COMPLETED
                or (
                    e.event.KIND is EventKind.TOOL_CALL_REQUESTED
                    and e.event.tool in (ATTACHED, "subagent")
                )
            ]
            if acted and not any(ATTACHED in tools for tools in attached):
                self.violation(f"{where}: started children or refunded with nothing attached")
        done = {e.event.seq: e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED}
        for envelope in log:
            event = envelope.event
            if event.KIND is EventKind.TOOL_CALL_REQUESTED and event.tool == ATTACHED:
                output = getattr(done.get(envelope.seq), "output", None)
                if isinstance(output, dict) and TOOL_ERROR_KEY in output:
                    self.violation(f"{where}: a refund answered {output[TOOL_ERROR_KEY]}")

    @staticmethod
    def invoices(root: Root) -> list[str]:
        """A graph run refunds its extra invoice too (no branch)."""
        if root.kind == "tree":
            return Composed.invoices(root)
        return [item["invoice_id"] for item in [*root.input["items"], root.input["extra"]]]

    def parked_for_a_person(self, store: EventStore, run_id: str, view: Any) -> bool:
        """Parked on an attached refund: open with no probe run, or its probe could not tell."""
        pending = view.pending
        return pending is not None and pending.kind == "tool" and pending.tool == ATTACHED

    def figures(self, began: float) -> dict:
        figures = super().figures(began)
        figures["roots_attached"] = len(self.attached)
        figures["children_inheriting"] = self.children
        return figures


def test_a_tool_attached_to_composed_runs_killed_at_random_instants_refunds_once(
    tmp_path: Path, store_url: str
) -> None:
    began = time.monotonic()
    kinds, kills = kill_schedule(store_url.startswith("sqlite"), SEED)
    harness = ComposedAttached(tmp_path, store_url, SEED)
    try:
        run_composed(harness, kinds, kills=kills, seconds=600)
    finally:
        harness.close()
    figures = harness.figures(began)
    print("composed attached tools chaos:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert figures["children_inheriting"] > 0, figures
    assert all(figures["kills_by_kind"].get(kind) for kind in ("random", "double", "in_write"))
