"""The refund workload of the composed kill tests (``test_kill_composed``, the cluster's and the
workers'): a handful of roots in flight, each refunding invoices of its own (no two runs share an
invoice, so every write a kill interrupts is a real one):

* a graph run: a ``map`` over 2-4 invoices whose body is the ``refunder`` agent (one child run
  per item: look the invoice up, refund it with the keyed, probed ``issue_refund``), a ``fold``
  counting the items, a ``gate`` the workload answers over the API (approved or not, drawn per
  run), and a ``branch`` on that answer: approved, a ``send_email`` tool node; refused, a
  refunder agent node inside the graph run itself, refunding one more invoice;
* a subagent tree: a ``delegator`` whose ``subagent`` calls start a refunder for each of its 1-3
  invoices (a child session is offered no ``subagent``, so a tree is one level deep: a second
  delegator under the first, as this workload once drew, refunded nothing).

The model is the scripted provider of ``test_kill_serve`` (answering after a short random delay,
so calls are in flight when kills land), walking a script read from each run's first message;
the demo tools' ledger counts every refund that reached the bank. A kill in a write lands at one
of the demo tools' fault points in a refund: before it is sent, between sending it and the
bank's answer, after the answer.

Beyond ``ComposedLoad``'s invariants: no identity was performed twice (the ledger holds at most
one refund per invoice; every refund a log records as done, performed or found by its probe, is
the ledger's one). A tree may rest on a write parked because its probe could not tell (the bank
was sent the refund, its answer never recorded).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from salvor.protocol import EventKind
from salvor.store import EventStore

from tests.chaos.composed_harness import MAP_NODE, ComposedLoad, Member, Root
from tests.chaos.test_kill_serve import agent_toml, step_reply
from tests.support.scripted_provider import ProviderCall, Reply

FINAL_TEXT = "refunds settled"
# Where the daemon kills itself inside a refund (the demo tools' fault points): after the intent
# is durable and before anything was sent; after the bank answered, before the call returned;
# between sending it and recording the bank's answer (its probe cannot tell).
WRITE_POINTS = (("issue_refund:before", 4), ("issue_refund", 4), ("issue_refund:sent", 1))


def refund_amount(invoice: str) -> int:
    return 100 + sum(map(ord, invoice)) % 900


def composed_script(call: ProviderCall) -> Reply:
    """One tool call per answer, read from the run's first message (``refund_steps``)."""
    work = json.loads(call.request["messages"][0]["content"][0]["text"])
    work = work.get("inputs", work)  # a subagent child's input: its task and its inputs
    return step_reply(call, refund_steps(work), final=FINAL_TEXT)


def refund_steps(work: dict) -> list:
    """A refunder looks its invoice up and refunds it; a delegator starts a refunder child for
    each of its invoices."""
    if "invoices" in work:
        return [
            ["subagent", {"agent": "refunder", "task": "refund", "inputs": {"invoice_id": i}}]
            for i in work["invoices"].split()
        ]
    invoice = work["invoice_id"]
    return [
        ["lookup_invoice", {"invoice_id": invoice}],
        ["issue_refund", {"invoice_id": invoice, "amount_cents": refund_amount(invoice)}],
    ]


def composed_graph(refunder: str) -> dict:
    """Refund every item (a map of refunder children), count them, ask, and on the answer
    either email or refund one more invoice inside the graph run itself."""
    return {
        "schema_version": 1,
        "nodes": [
            {
                "id": MAP_NODE,
                "kind": "map",
                "over": "$input.items",
                "concurrency": 2,
                "body": {"kind": "agent", "agent": refunder, "input": "$item"},
            },
            {"id": "tally", "kind": "fold", "over": f"$nodes.{MAP_NODE}", "reducer": "count"},
            {"id": "approve", "kind": "gate", "prompt": "Tell the customer?"},
            {
                "id": "route",
                "kind": "branch",
                "on": "$nodes.approve.approved",
                "cases": ["true", "false"],
                "default": "false",
            },
            {
                "id": "notify",
                "kind": "tool",
                "tool": "send_email",
                "input": {"to": "ops@example.com", "subject": "refunds", "body": "$input.case"},
            },
            {"id": "extra", "kind": "agent", "agent": refunder, "input": "$input.extra"},
        ],
        "edges": [
            {"from": MAP_NODE, "to": "tally"},
            {"from": "tally", "to": "approve"},
            {"from": "approve", "to": "route"},
            {"from": "route", "to": "notify", "case": "true"},
            {"from": "route", "to": "extra", "case": "false"},
        ],
    }


class Composed(ComposedLoad):
    """The refund workload on ``ComposedLoad``'s daemon, stops and invariants."""

    write_points = WRITE_POINTS

    def __init__(self, tmp_path: Path, store_url: str, seed: int, *, script=composed_script):
        super().__init__(tmp_path, store_url, seed, script=script)
        self.refunder: str | None = None
        self.writes_cut: set[tuple[str, int]] = set()  # refunds open at some stop
        self.settled_by_probe: Counter = Counter()  # the probe's "found" -> refunds it settled

    def register(self) -> None:
        base = self.provider.base_url
        hashes = []
        for toml in (
            agent_toml(base, "refunder", ["lookup_invoice", "issue_refund"]),
            agent_toml(base, "delegator", [], ["subagent"]),
        ):
            response = self.http.post(
                "/v1/agents", content=toml, headers={"content-type": "application/toml"}
            )
            assert response.status_code == 201, response.text
            hashes.append(response.json()["agent"])
        self.refunder, self.agent = hashes
        response = self.http.post("/v1/graphs", json=composed_graph(self.refunder))
        assert response.status_code == 201, response.text
        self.graph = response.json()["graph"]

    def draw_root(self, case: str) -> Root:
        if self.rng.random() < 0.5:
            items = [{"invoice_id": f"INV-{case}-{i}"} for i in range(self.rng.randint(2, 4))]
            run_input = {"case": case, "items": items, "extra": {"invoice_id": f"INV-{case}-x"}}
            return Root(case, "graph", run_input, answer={"approved": self.rng.random() < 0.5})
        invoices = " ".join(f"INV-{case}-{i}" for i in range(self.rng.randint(1, 3)))
        run_input = {"task": "delegate", "inputs": {"invoices": invoices}}
        return Root(case, "tree", run_input, run_id=str(uuid.uuid4()))

    def check_world(self) -> Counter:
        """The refunds the bank holds, by invoice; an invoice refunded twice is a violation."""
        ledger = self.ledger()
        refunds = Counter(r["input"]["invoice_id"] for r in ledger if r["tool"] == "issue_refund")
        for invoice, times in refunds.items():
            if times > 1:
                runs = [
                    (r["run_id"], r["seq"])
                    for r in ledger
                    if r["tool"] == "issue_refund" and r["input"]["invoice_id"] == invoice
                ]
                self.violation(f"invoice {invoice} refunded {times} times, by (run, seq) {runs}")
        return refunds

    def check_trees(self, *, final: bool = False) -> None:
        """``ComposedLoad``'s, and at the end: every invoice of a tree that completed was
        refunded (once: more is a violation already)."""
        super().check_trees(final=final)
        if not final:
            return
        refunds = Counter(
            r["input"]["invoice_id"] for r in self.ledger() if r["tool"] == "issue_refund"
        )
        for root in self.roots.values():
            if root.case in self.final:
                for invoice in self.invoices(root):
                    if refunds[invoice] != 1:
                        self.violation(f"{root.kind} {root.case} completed, {invoice} refunded "
                                       f"{refunds[invoice]} times")  # fmt: skip

    @staticmethod
    def invoices(root: Root) -> list[str]:
        """The invoices a root refunds once it completed."""
        if root.kind == "tree":
            return root.input["inputs"]["invoices"].split()
        extra = [] if root.answer.get("approved", False) else [root.input["extra"]]
        return [item["invoice_id"] for item in [*root.input["items"], *extra]]

    def check_log(
        self, where: str, member: Member, view: Any, refunds: Counter, *, final: bool
    ) -> None:
        """Every refund the log records done is the bank's one."""
        pending = view.pending
        if pending is not None and pending.kind == "tool" and pending.tool == "issue_refund":
            self.writes_cut.add((member.run_id, pending.seq))
        log = member.log
        done = {e.event.seq: e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED}
        for envelope in log:
            event = envelope.event
            if event.KIND is not EventKind.TOOL_CALL_REQUESTED or event.tool != "issue_refund":
                continue
            invoice = event.input["invoice_id"]
            completion = done.get(envelope.seq)
            if completion is None or completion.settled_by == "operator":
                continue
            if completion.settled_by == "probe" and final:
                self.settled_by_probe[completion.probe["answer"].get("found")] += 1
            if completion.deduplicated_from is not None:
                self.violation(
                    f"{where}: the refund of {invoice} copied another run's "
                    f"({completion.deduplicated_from}), though no run shares its invoice"
                )
            elif refunds[invoice] != 1:
                self.violation(
                    f"{where}: the refund of {invoice} is recorded done "
                    f"(settled by {completion.settled_by or 'its call'}) and the bank holds "
                    f"{refunds[invoice]}"
                )

    def parked_for_a_person(self, store: EventStore, run_id: str, view: Any) -> bool:
        """Parked on a refund whose probe could not tell."""
        seq = view.pending.seq
        answer = store.claims.probe_answers([(run_id, seq)]).get((run_id, seq))
        return answer is not None and answer.verdict == "unknown"

    def what_pending(self, run_id: str, pending: Any) -> str:
        if pending.kind == "tool" and pending.tool == "issue_refund":
            return self.bank_saw(run_id, pending.seq)
        return ""

    def bank_saw(self, run_id: str, seq: int) -> str:
        """What the ledger shows of the refund at ``seq`` of ``run_id``."""
        lines = (
            self.effects.read_text(encoding="utf-8").splitlines() if self.effects.exists() else []
        )
        records = [
            r["tool"] for r in map(json.loads, lines) if r["run_id"] == run_id and r["seq"] == seq
        ]
        if "issue_refund" in records:
            return "the bank holds its refund"
        if "issue_refund:sent" in records:
            return "the bank was sent it and never answered"
        return "the bank was never sent it"

    def figures(self, began: float) -> dict:
        figures = super().figures(began)
        figures["refunds_cut_open"] = len(self.writes_cut)
        figures["refunds_settled_by_probe"] = {str(k): n for k, n in self.settled_by_probe.items()}
        return figures
