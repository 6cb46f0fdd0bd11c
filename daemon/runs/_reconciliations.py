"""The reconciliation queue's items: a run parked on a write nobody knows landed, with what a
person needs to settle it.

An item says which write (the same ``intent`` the 409 needs_reconciliation refusal carries), when
it was parked, its key, and what ``POST /v1/runs/{id}/resolve`` expects: for a write a client
performed, the output its declaration here checks (salvor witnessed none of it); for one salvor
performed, any output. Pure: built from a view and the client tool declarations, reading nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from salvor.protocol import Actor, RunView
from salvor.store import ProbeAnswer

from ..client_runs import ClientTool


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconciliation:
    """One run of the queue: its view (``pending`` is the parked write) and what settles it."""

    run_id: str
    view: RunView
    # The client tool's declaration, when a client performed the write and it is declared here.
    declaration: ClientTool | None = None
    probe: dict | None = None

    @property
    def performed_by(self) -> str:
        return "client" if self.view.pending.performed_by == Actor.CLIENT else "salvor"

    def resolve_json(self) -> dict[str, Any]:
        """What ``POST /v1/runs/{id}/resolve`` expects for this write."""
        declared = self.declaration
        recorded_input = self.view.pending.input
        require_equal = {}
        if declared is not None:
            # Held to the recorded intent's values, as ClientTool.check_output holds them.
            given = recorded_input if isinstance(recorded_input, dict) else {}
            require_equal = {name: given.get(name) for name in declared.require_equal}
        return {
            "path": f"/v1/runs/{self.run_id}/resolve",
            "performed_by": self.performed_by,
            "output_schema": declared.output_schema if declared is not None else None,
            "require_equal": require_equal,
        }

    def to_json(self) -> dict[str, Any]:
        """The item as ``GET /v1/reconciliations`` lists it (and ``salvor reconcile --json``)."""
        pending = self.view.pending
        return {
            "run": self.run_id,
            "agent": self.view.agent_def_hash,
            "labels": self.view.labels or {},
            "parked_since": pending.recorded_at,
            "intent": pending.intent_json(),
            "idempotency_key": pending.idempotency_key,
            "probe": self.probe,
            "resolve": self.resolve_json(),
        }


def probe_member(answer: ProbeAnswer | None) -> dict | None:
    """The ``probe`` member of an item: the last answer of its write's probe, if it ran."""
    if answer is None:
        return None
    return {
        "tool": answer.tool,
        "input": answer.input,
        "answer": answer.answer,
        "error": answer.error,
        "verdict": answer.verdict,
        "observed_at": answer.observed_at,
    }


def reconciliation(
    run_id: str,
    view: RunView,
    client_tools: Mapping[str, ClientTool],
    probed: ProbeAnswer | None = None,
) -> Reconciliation:
    """The queue's item for a run parked on ``view.pending`` (``probed``: its probe's answer)."""
    declared = None
    if view.pending.performed_by == Actor.CLIENT:
        declared = client_tools.get(view.pending.tool)
    return Reconciliation(
        run_id=run_id, view=view, declaration=declared, probe=probe_member(probed)
    )
