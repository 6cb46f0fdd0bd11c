"""Kill safety of a keyed registry write attached at run time and relayed to process agents in
composed runs: a real `salvor serve --allow-process-agents` keeps roots of run trees in flight,
each given the demo ``issue_refund`` (keyed by invoice, probed by ``lookup_refund``) over
``POST /v1/runs/{id}/tools`` while it waits on the workload, before it starts any child, and is
stopped at random instants (``composed_harness``'s stops, a kill inside a refund among them).

Each root is a subagent tree: a built-in ``delegator`` asks a question first (the workload
attaches the tool and answers), starts a ``clerk`` child for each of its 1-3 invoices and one
more for its first, then refunds its first invoice itself. A clerk is a process agent (the
``mcp`` SDK stand-in script) that refunds its invoice through the ``salvor`` MCP server's relay
of the attachment its run inherited. The first invoice is shared three ways, two relayed calls
in two child runs and a built-in call in the root, so one identity is claimed across runs and
across kinds. No graph run: a map node runs built-in agents only (the daemon refuses a process
agent there), and neither a map item nor a graph's agent node is offered ``subagent``, so a
graph run has no process child to give.

Beyond ``ComposedLoad``'s invariants (logs contiguous and legal, nothing by hand), after every
stop and at the end: the bank's ledger holds at most one refund per invoice, and every refund a
log records done (performed, copied or settled by its probe) is that one and answered no error;
every child's head inherited the attachment, and every root that started a child or refunded
recorded it. At the end every invoice of a tree that completed was refunded once, and every
tree completed or rests with a refund parked for a person (its probe could not tell: the bank
was sent it and never answered) and its other runs waiting on it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from salvor.daemon.proxies._mcp_lane import call_failed
from salvor.protocol import TOOL_ERROR_KEY, EventKind

from tests.chaos.composed_harness import SEED, Member, Root, run_composed
from tests.chaos.composed_refunds import WRITE_POINTS, Composed, refund_amount
from tests.chaos.test_kill_composed_process_files import POSTGRES_STOPS, SQLITE_STOPS
from tests.chaos.test_kill_serve import agent_toml, step_reply
from tests.daemon.agents.test_process_agent import SECRET
from tests.daemon.files.test_process_file_tools import _process_agent
from tests.support.scripted_provider import ProviderCall, Reply

pytestmark = pytest.mark.kill

ATTACHED = "issue_refund"
SALVOR_CALL = "mcp:salvor/tools/call"
QUESTION = {"question": "Go ahead?", "type": "input"}
TOOLS_LABEL = "salvor.tools"
FINAL_TEXT = "refunds settled"


def refund(invoice: str) -> list:
    return [ATTACHED, {"invoice_id": invoice, "amount_cents": refund_amount(invoice)}]


def relay_script(call: ProviderCall) -> Reply:
    """One tool call per answer, read from the run's first message: a delegator asks, starts a
    clerk per invoice (its first twice) and refunds its first itself; a clerk refunds its
    invoice."""
    work = json.loads(call.request["messages"][0]["content"][0]["text"])
    work = work.get("inputs", work)  # a subagent child's input: its task and its inputs
    if "invoices" in work:
        invoices = work["invoices"].split()
        steps = [["ask_user", QUESTION]]
        steps += [
            ["subagent", {"agent": "clerk", "task": "refund", "inputs": {"invoice_id": i}}]
            for i in [*invoices, invoices[0]]
        ]
        steps.append(refund(invoices[0]))
    else:
        steps = [refund(work["invoice_id"])]
    return step_reply(call, steps, final=FINAL_TEXT)


def refund_intent(event: Any) -> str | None:
    """The invoice a refund intent names, built-in or relayed (None for another event)."""
    if event.KIND is not EventKind.TOOL_CALL_REQUESTED:
        return None
    if event.tool == ATTACHED:
        return event.input["invoice_id"]
    if event.tool == SALVOR_CALL and event.input.get("name") == ATTACHED:
        return event.input["arguments"]["invoice_id"]
    return None


class ComposedRelay(Composed):
    """Attached refunds relayed to process-agent children, shared with a built-in call."""

    write_points = WRITE_POINTS
    # Each child is a process (a Python importing the mcp SDK): as the process file workload.
    in_flight_roots = 4

    def __init__(self, tmp_path: Path, store_url: str, seed: int) -> None:
        super().__init__(tmp_path, store_url, seed, script=relay_script)
        self.tmp_path = tmp_path
        self.attached: set[str] = set()  # roots whose attachment was answered 200
        self.children = 0  # child runs found inheriting the attachment, at the end
        self.relayed_done = 0  # relayed refunds recorded done, at the end
        self.copied = 0  # refunds recorded done as another call's outcome, at the end
        self.daemon.allow_process_agents()
        self.daemon.env.update(SALVOR_AGENT_UPSTREAM=self.provider.base_url,
                               SALVOR_AGENT_KEY=SECRET)  # fmt: skip
        self.http.headers.update(self.daemon.headers)

    def register(self) -> None:
        hashes = []
        for toml in (
            _process_agent(self.tmp_path, []),
            agent_toml(self.provider.base_url, "delegator", [], ["subagent", "ask_user"]),
        ):
            response = self.http.post(
                "/v1/agents", content=toml, headers={"content-type": "application/toml"}
            )
            assert response.status_code == 201, response.text
            hashes.append(response.json()["agent"])
        self.agent = hashes[1]

    def draw_root(self, case: str) -> Root:
        invoices = [f"INV-{case}-{i}" for i in range(self.rng.randint(1, 3))]
        run_input = {"task": "delegate", "inputs": {"invoices": " ".join(invoices)}}
        return Root(case, "tree", run_input, answer={"answer": "go"}, run_id=str(uuid.uuid4()))

    def answer(self, root: Root) -> None:
        """Attach the tool (again after a stop: a tool the run has records nothing), then
        answer; a root a drive still holds is tried on a later round."""
        response = self.call("POST", f"/v1/runs/{root.run_id}/tools", json={"tools": [ATTACHED]})
        if response is None or response.status_code != 200:
            return
        self.attached.add(root.case)
        super().answer(root)

    @staticmethod
    def invoices(root: Root) -> list[str]:
        return root.input["inputs"]["invoices"].split()

    def check_log(self, where: str, member: Member, view: Any, refunds: Counter, *, final: bool):
        """Every refund recorded done is the bank's one and answered no error; a child
        inherited the attachment, a root that acted recorded it."""
        self._check_refunds(where, member, view, refunds, final=final)
        self._check_attachment(where, member, final=final)

    def _check_refunds(self, where: str, member: Member, view: Any, refunds: Counter, *, final):
        """Every refund the log records done, relayed or built-in, is the bank's one."""
        log = member.log
        pending = view.pending
        if (
            pending is not None
            and pending.kind == "tool"
            and pending.tool in (ATTACHED, SALVOR_CALL)
        ):
            self.writes_cut.add((member.run_id, pending.seq))
        done = {e.event.seq: e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED}
        for envelope in log:
            invoice = refund_intent(envelope.event)
            completion = done.get(envelope.seq)
            if invoice is None or completion is None or completion.settled_by == "operator":
                continue
            relayed = envelope.event.tool == SALVOR_CALL
            if final:
                self.relayed_done += relayed
                self.copied += completion.deduplicated_from is not None
                if completion.settled_by == "probe":
                    self.settled_by_probe["relayed" if relayed else "built-in"] += 1
            output = completion.output
            failed = call_failed(output) if relayed else (
                isinstance(output, dict) and TOOL_ERROR_KEY in output
            )  # fmt: skip
            if failed:
                self.violation(f"{where}: the refund of {invoice} answered {output}")
            elif refunds[invoice] != 1:
                self.violation(
                    f"{where}: the {'relayed' if relayed else 'built-in'} refund of {invoice} is "
                    f"recorded done (settled by {completion.settled_by or 'its call'}, copied from "
                    f"{completion.deduplicated_from}) and the bank holds {refunds[invoice]}"
                )

    def _check_attachment(self, where: str, member: Member, *, final: bool) -> None:
        """A child's head inherited the attachment; a root that acted recorded it."""
        log = member.log
        if member.parent is not None:
            labels = log[0].event.labels or {}
            if ATTACHED not in (labels.get(TOOLS_LABEL) or "").split(","):
                self.violation(f"{where}: its head's tools are {labels.get(TOOLS_LABEL)!r}")
            self.children += final
            return
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

    def parked_for_a_person(self, store: Any, run_id: str, view: Any) -> bool:
        """Parked on a refund, built-in or relayed, its probe could not settle."""
        pending = view.pending
        return (
            pending is not None
            and pending.kind == "tool"
            and pending.tool in (ATTACHED, SALVOR_CALL)
        )

    def what_pending(self, run_id: str, pending: Any) -> str:
        if pending.kind == "tool" and pending.tool in (ATTACHED, SALVOR_CALL):
            return self.bank_saw(run_id, pending.seq)
        return ""

    def _quiet(self) -> bool:
        """No run of any tree is driven, at a gate or asleep (children included: a parent waits
        on its process child with no drive of its own)."""
        for status in ("running", "suspended", "sleeping"):
            response = self.call("GET", "/v1/runs", params={"status": status})
            if response is None:
                return False
            assert response.status_code == 200, response.text
            listed = response.json()["runs"]
            if any(status != "running" or run.get("driver") != "none" for run in listed):
                return False
        return True

    def figures(self, began: float) -> dict:
        figures = super().figures(began)
        figures["roots_attached"] = len(self.attached)
        figures["children_inheriting"] = self.children
        figures["relayed_refunds_done"] = self.relayed_done
        figures["refunds_copied"] = self.copied
        return figures


def test_attached_refunds_relayed_to_process_children_killed_at_random_instants_land_once(
    tmp_path: Path, store_url: str
) -> None:
    began = time.monotonic()
    kinds = SQLITE_STOPS if store_url.startswith("sqlite") else POSTGRES_STOPS
    kills = len(kinds) + kinds.count("double") + kinds.count("in_write")
    harness = ComposedRelay(tmp_path, store_url, SEED)
    try:
        run_composed(harness, kinds, kills=kills, seconds=300)
    finally:
        harness.close()
    figures = harness.figures(began)
    print("composed relayed refunds chaos:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert figures["children_inheriting"] > 0, figures
    assert figures["relayed_refunds_done"] > 0, figures
    assert figures["refunds_copied"] > 0, figures
    assert all(figures["kills_by_kind"].get(kind) for kind in ("random", "double", "in_write"))
