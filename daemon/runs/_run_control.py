"""A person's verbs on a run that exists: resume it, record what a dangling write did, abandon it
(and the children it leaves).

Each verb checks everything it can before it records anything: a refusal (``OperationRefused``)
leaves the store exactly as it was. None drives the run: a resume says whether the caller should
(``ResumeDecision``), and the caller does.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from salvor.protocol import (
    TERMINAL_STATES,
    Actor,
    ErrorCode,
    NextStep,
    NodeKind,
    Resumed,
    RunAbandoned,
    RunState,
    RunView,
    SchemaViolation,
    StepKind,
    ToolCallCompleted,
    check_resume_input,
    parse_instant,
)

from ..client_runs import ClientTool, check_resolution
from ..flows import MAP_OF_LABEL, PARENT_LABEL
from ..recording import StoreAccess, claim_to_settle, needs_reconciliation, tool_error
from ..web import OperationRefused, bad_request, off_loop, wrong_state
from ._definitions import Definitions
from ._run_reads import RunReads

# A resume given no input at all (None is an input; a parked run needs one, others need none).
MISSING: Any = object()

# The error kind of a write a person recorded as not landed, and what the model is told.
NOT_LANDED = "not_landed"
_NOT_LANDED_MESSAGE = (
    "a person checked that this {tool} call did not happen, and nothing was performed; "
    "calling it again performs it afresh under the same idempotency key"
)


class ResumeOutcome(enum.StrEnum):
    """What a resume decided: drive the run now, or leave it (it has nothing left to do)."""

    DRIVING = "driving"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class ResumeDecision:
    """What a resume found: ``driving`` (drive the run now) or ``finished`` (leave it)."""

    outcome: ResumeOutcome
    view: RunView


class RunControl:
    """Resume, resolve and abandon over one store; ``reads`` and ``definitions`` check first."""

    def __init__(
        self,
        access: StoreAccess,
        definitions: Definitions,
        reads: RunReads,
        *,
        clock: Callable[[], datetime],
    ) -> None:
        self.access = access
        self.definitions = definitions
        self.reads = reads
        # Whether a sleeping run's timer is due yet, when the caller does not say.
        self.clock = clock

    async def resume(
        self, run_id: str, run_input: Any = MISSING, *, now: datetime | None = None
    ) -> ResumeDecision:
        """Decide how to continue a run, recording its Resumed event when it was parked.

        Returns ``driving`` when the caller should now drive the run (a run
        parked on a write whose tool declares a probe included: the drive
        probes it), or ``finished`` for a completed, failed or abandoned run
        (left alone).

        Raises:
            OperationRefused: unknown_run, client_driven_run, bad_request (a
                parked run with no input, or one its schema rejects),
                needs_reconciliation, still_sleeping, unknown_agent.
        """
        view = await self.reads.view(run_id)
        if view.driven_by == Actor.CLIENT:
            raise OperationRefused(
                ErrorCode.CLIENT_DRIVEN_RUN,
                f"run {run_id} is client-driven; its client resumes it by opening it again, so "
                "this daemon never becomes a second writer against the client's lease",
            )
        state = view.state
        if view.terminal:
            return ResumeDecision(ResumeOutcome.FINISHED, view)
        if state is RunState.NEEDS_RECONCILIATION:
            if not await self.reads.probes_on_drive(view):
                raise needs_reconciliation(run_id, view)
            return ResumeDecision(ResumeOutcome.DRIVING, view)
        if state is RunState.SLEEPING:
            _refuse_still_sleeping(run_id, view, now or self.clock())
        gate = await self._open_gate(view)
        if state in (RunState.SUSPENDED, RunState.BUDGET_EXCEEDED):
            view = await self._resumed(run_id, view, run_input, gate)
        return ResumeDecision(ResumeOutcome.DRIVING, view)

    async def _open_gate(self, view: RunView) -> str | None:
        """The gate a suspended graph run waits at, if it waits at one; its graph and agents, or
        its agent, loaded on the way (unknown_agent when the store no longer builds them)."""
        if view.graph_hash is None:
            await self.definitions.load_agent(view.agent_def_hash)
            return None
        graph = await self.definitions.load_graph(view.graph_hash)
        await self.definitions.graph_agents(graph)
        if view.state is RunState.SUSPENDED and view.open_node is not None:
            node = graph.node(view.open_node)
            return node.id if node.kind is NodeKind.GATE else None
        return None

    async def _resumed(
        self, run_id: str, view: RunView, run_input: Any, gate: str | None
    ) -> RunView:
        """Record the ``Resumed`` of a run parked on an input or a budget, once ``run_input``
        meets what it waits for; its view after.

        Raises:
            OperationRefused: bad_request (no input, or one its schema rejects), or
                approval_schema_violation at ``gate``. Nothing is recorded.
        """
        if run_input is MISSING:
            what = (
                "an input matching its input_schema"
                if view.state is RunState.SUSPENDED
                else 'a budget extension such as {"extend_by": 1000}'
            )
            raise bad_request(f"run {run_id} is {view.state.value}; resume it with {what}")
        try:
            # A gate's schema is compiled, and the answer checked, off the loop.
            await off_loop(check_resume_input, view, run_input)
        except SchemaViolation as exc:
            if gate is not None:
                # Parked at a gate (its Suspended recorded the approval_schema).
                raise OperationRefused(
                    ErrorCode.APPROVAL_SCHEMA_VIOLATION,
                    f"gate {gate!r} refuses this approval: {exc.message}",
                    details={"node": gate, "violations": exc.violations},
                ) from None
            raise bad_request(exc.message, details={"violations": exc.violations}) from None
        _, view = await self.access.append(run_id, [Resumed(input=run_input)], view)
        return view

    async def resolve(
        self,
        run_id: str,
        output: Any,
        client_tools: Mapping[str, ClientTool],
        *,
        not_landed: bool = False,
    ) -> RunView:
        """Record by hand what a dangling write did. Records one event; drives nothing.

        With an ``output``: the write happened and returned it. A write a client performed is
        checked against its declaration in ``client_tools`` first; a write salvor performed is
        not (it witnessed it). A write that claimed its idempotency identity settles it, so a
        later call under the same key copies this outcome.

        With ``not_landed`` (``output`` is then ignored): a person checked that the write did
        not happen. It completes as a failed call (the ``not_landed`` error sentinel, which the
        model is told) and gives up the identity it claimed, so the next call with that
        identity, in this run or another, performs it afresh under the same key.

        Raises:
            OperationRefused: unknown_run, wrong_state when the run has no open write, or
                bad_request when a client's write has no declaration here or the output fails
                it. Nothing is recorded.
        """
        view = await self.reads.view(run_id)
        if view.state is not RunState.NEEDS_RECONCILIATION:
            _refuse_no_dangling_write(run_id, view)
        pending = view.pending
        if not_landed:
            completion = ToolCallCompleted(
                seq=pending.seq,
                output=tool_error(NOT_LANDED, _NOT_LANDED_MESSAGE.format(tool=pending.tool), 1),
                settled_by=Actor.OPERATOR,
            )
            # The store gives the identity up only when this very intent holds it open.
            _, view = await self.access.append(
                run_id, [completion], view, release=pending.idempotency_key
            )
            return view
        if pending.performed_by == Actor.CLIENT:
            check_resolution(client_tools, run_id, pending.tool, pending.input, output)
        settle = await claim_to_settle(self.access, run_id, pending.seq, pending.idempotency_key)
        _, view = await self.access.append(
            run_id,
            [ToolCallCompleted(seq=pending.seq, output=output, settled_by=Actor.OPERATOR)],
            view,
            settle=settle,
        )
        return view

    async def abandon(self, run_id: str, reason: str | None = None) -> tuple[int, RunView]:
        """Retire a run by hand with a terminal RunAbandoned; returns (appended seq, view).

        A drive of the run in this process is stopped first (``RunDriving.stop``), and those
        waiting to drive it with it: its process group is killed and waited for, and whatever the
        drive records on its way out (a paid model call's answer) lands before ``RunAbandoned``.
        The run is then held while ``RunAbandoned`` is appended, so nothing is recorded after it.

        Its subagent children and map items that have not ended are abandoned after it, and
        theirs after them, each saying why. A failure partway (the store) leaves the run abandoned
        and the children not yet reached as they were; abandoning a child by hand finishes the
        job.

        Raises:
            OperationRefused: unknown_run, or wrong_state for a terminal run.
        """
        view = await self.reads.view(run_id)
        self._refuse_terminal(view)
        self.access.driving.stop(run_id, "the run is being abandoned")
        # Here only: an abandon records the run's end over whichever node drives it (unfenced);
        # that node's drive finds it at its next heartbeat or append, and stops.
        async with self.access.driving.hold(run_id, here=True):
            # The stopped drive may have recorded on its way out, or ended the run.
            view = await self.reads.view(run_id)
            self._refuse_terminal(view)
            unresolved = None
            if view.state is RunState.NEEDS_RECONCILIATION:
                unresolved = {"seq": view.pending.seq, "tool": view.pending.tool}
            envelopes, view = await self.access.append(
                run_id, [RunAbandoned(reason=reason, unresolved_write=unresolved)], view
            )
        await self._abandon_children(run_id)
        return envelopes[-1].seq, view

    @staticmethod
    def _refuse_terminal(view: RunView) -> None:
        if view.terminal:
            raise wrong_state(
                f"run {view.run_id} is already {view.state.value}; there is nothing left to abandon"
            )

    async def _abandon_children(self, parent: str) -> None:
        """Abandon the children of ``parent`` that have not ended (``abandon``): its subagents'
        and, for a graph run, its map items', whose drive was its walk's (left alone, the next
        start would recover them as runs of their own and finish work nobody wants)."""
        for label, why in (
            (PARENT_LABEL, f"its parent run {parent} was abandoned"),
            (MAP_OF_LABEL, f"its graph run {parent} was abandoned"),
        ):
            children, _ = await self.reads.list_runs(label=(label, parent))
            for child in children:
                if child.state is None or RunState(child.state) in TERMINAL_STATES:
                    continue
                try:
                    await self.abandon(child.run_id, why)
                except OperationRefused:
                    pass  # it ended between the listing and now: nothing left to abandon


def _refuse_still_sleeping(run_id: str, view: RunView, now: datetime) -> None:
    """Refuse to resume a sleeping run before its instant (still_sleeping, with how long)."""
    stamp = view.detail["wake_at"]
    wake_at = parse_instant(stamp)
    if now < wake_at:
        remaining = math.ceil((wake_at - now).total_seconds())
        raise OperationRefused(
            ErrorCode.STILL_SLEEPING,
            f"run {run_id} is sleeping until {stamp} and cannot be resumed for another "
            f"{remaining}s",
            details={"wake_at": stamp, "remaining_seconds": remaining},
            next_step=NextStep(kind=StepKind.AWAIT_WAKE, run=run_id, wake_at=stamp),
        )


def _refuse_no_dangling_write(run_id: str, view: RunView) -> None:
    """Refuse to resolve a run with no write of unknown outcome (wrong_state), naming what
    continues it instead."""
    if view.pending is not None:
        fault = (
            f"run {run_id} has no dangling write to resolve: its open {view.pending.kind} "
            f"call at seq {view.pending.seq} is safe to perform again"
        )
        if view.driven_by == Actor.CLIENT:
            raise wrong_state(
                f"{fault}, so its client performs it again on its next drive, and it needs nobody"
            )
        raise wrong_state(fault, next_step=NextStep(kind=StepKind.RESUME_RUN, run=run_id))
    raise wrong_state(f"run {run_id} has no dangling write to resolve (it is {view.state.value})")
