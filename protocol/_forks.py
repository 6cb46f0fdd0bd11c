"""Planning a fork of a graph run: what it copies, which recorded writes it would re-fire,
and whether it may proceed.

Rules of this module:

* A fork cuts the origin's log just below the fork node's ``NodeEntered``.
  Everything before the cut (the *prefix*, seq 0..``through_seq``) is copied
  into the child; everything after it (the *re-walked segment*) is walked
  again by the child and never copied.
* The only hazard is a ``write`` the segment recorded: walking it again
  performs it again. ``read`` calls have no effect and ``idempotent`` ones are
  keyed by their place in the graph, so the child presents its origin's key
  and the claim store collapses the duplicate: neither is ever listed.
* A map node's items run in child runs of their own, whose ids derive from
  the graph run's, so a fork's walk starts new ones: a write an item of a map
  in the segment recorded fires again too. It is listed under the seq of that
  map node's ``NodeEntered`` (the origin position the fan-out starts at),
  naming the item's run and its seq there; acknowledging that seq lets every
  item write of that map fire again.
* Refuse, then record: a plan names every unacknowledged write, and a fork
  proceeds only when the operator acknowledged all of them (``check_proceeds``).
* The prefix ends between nodes by construction (a node is entered only
  while nothing is open), so the child starts with no open intent and no open
  node: it is a graph run interrupted between two nodes, and recovers as one.
  ``plan_fork`` checks this rather than trusting it.
* Pure: no IO, no clock. The child's ``recorded_at`` are the store's, stamped
  when the fork is appended; the origin's instants stay in the origin's log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._envelope import Envelope
from ._error_codes import ErrorCode
from ._errors import NextStep, ProtocolError, StepKind, excerpt
from ._event_codec import Event
from ._event_kinds import Effect
from ._events import GraphRunStarted, NodeEntered, ToolCallCompleted, ToolCallRequested
from ._fold import RunState, RunView, fold


class ForkRefused(ProtocolError):
    """A fork that is not made: its code says why (the spec's fork refusals, or bad_request)."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        details: dict | None = None,
        next_step: NextStep | None = None,
    ) -> None:
        super().__init__(message, details=details, next_step=next_step)
        self.code = code


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedWrite:
    """A ``write`` intent of the re-walked segment, as the refusal lists it."""

    seq: int
    tool: str
    input: Any
    idempotency_key: str | None
    recorded_at: str
    # A map item's write: the child run that recorded it, and its seq there (``seq`` is then the
    # map node's entry in the origin).
    run: str | None = None
    run_seq: int | None = None

    def to_json(self) -> dict:
        body = {
            "seq": self.seq,
            "tool": self.tool,
            "input": self.input,
            "idempotency_key": self.idempotency_key,
            "recorded_at": self.recorded_at,
        }
        if self.run is not None:
            body["run"], body["run_seq"] = self.run, self.run_seq
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkPlan:
    """What forking ``origin`` from ``from_node`` copies and would re-fire."""

    origin: str
    from_node: str
    graph_hash: str
    through_seq: int
    # The origin's envelopes seq 0..through_seq; the child records its own head instead of 0.
    prefix: tuple[Envelope, ...]
    writes: tuple[RecordedWrite, ...]
    # The operator's acknowledgements, ascending and once each; every one is a write of `writes`.
    acknowledged: tuple[int, ...]

    @property
    def unacknowledged(self) -> tuple[RecordedWrite, ...]:
        acknowledged = set(self.acknowledged)
        return tuple(write for write in self.writes if write.seq not in acknowledged)

    @property
    def would_proceed(self) -> bool:
        return not self.unacknowledged

    @property
    def forked_from(self) -> dict:
        """The ``ForkOrigin`` record the child's head carries."""
        return {
            "run_id": self.origin,
            "through_seq": self.through_seq,
            "from_node": self.from_node,
            "graph_hash": self.graph_hash,
            "acknowledged_writes": list(self.acknowledged),
        }

    def dry_run_json(self) -> dict:
        """The body of a dry run: the plan, creating nothing."""
        return {
            "dry_run": True,
            "origin": self.origin,
            "from_node": self.from_node,
            "through_seq": self.through_seq,
            "graph_hash": self.graph_hash,
            "prefix_event_count": len(self.prefix),
            "writes": [write.to_json() for write in self.writes],
            "unacknowledged_writes": [write.seq for write in self.unacknowledged],
            "would_proceed": self.would_proceed,
        }

    def check_proceeds(self) -> None:
        """Refuse the fork while any write of the segment is unacknowledged.

        Raises:
            ForkRefused: write_replay_hazard, ``details.writes`` exactly the
                unacknowledged writes, in log order.
        """
        missing = self.unacknowledged
        if missing:
            seqs = ", ".join(str(write.seq) for write in missing)
            raise ForkRefused(
                ErrorCode.WRITE_REPLAY_HAZARD,
                f"forking run {self.origin} from node {self.from_node!r} would re-execute "
                f"{len(missing)} recorded write(s) (seq {seqs}); acknowledge each seq that may "
                "fire again (`acknowledge_writes`) to fork",
                details={"writes": [write.to_json() for write in missing]},
            )


def plan_fork(
    origin_envelopes: Sequence[Envelope],
    from_node: str,
    acknowledged: Iterable[int] = (),
    *,
    map_items: Mapping[int, Sequence[Sequence[Envelope]]] | None = None,
) -> ForkPlan:
    """Plan forking the run whose whole log is ``origin_envelopes`` from ``from_node``.

    ``map_items``: the logs of the child runs a map node's items ran in, by the
    origin seq of that node's ``NodeEntered`` (an item not started yet has an
    empty log, or none). Those of a map in the re-walked segment add their
    writes to the hazards; the others are ignored.

    A plan with unacknowledged writes is returned, not refused: a dry run
    reports it, and ``ForkPlan.check_proceeds`` refuses it.

    Raises:
        ForkRefused: not_a_graph_run (the log does not open with
            GraphRunStarted), origin_needs_reconciliation (the origin is parked
            at a write of unknown outcome; ``details.intent`` is it),
            invalid_fork_node (the origin never entered ``from_node``), or
            bad_request (an acknowledged seq that is not a write of the
            re-walked segment). Checked in that order.
    """
    log = list(origin_envelopes)
    head = log[0].event if log else None
    origin = log[0].run_id if log else "?"
    if not isinstance(head, GraphRunStarted):
        raise ForkRefused(
            ErrorCode.NOT_A_GRAPH_RUN,
            f"run {origin} is an agent run, not a graph run; only a graph run forks from a node",
        )
    _check_reconciled(fold(log), origin)
    entry = _entry_of(log, from_node, origin)
    through_seq = entry - 1
    prefix = tuple(log[:entry])
    _check_between_nodes(fold(prefix), origin, through_seq)
    writes = _rewalked_writes(log, entry, map_items or {})
    acked = sorted(set(acknowledged))
    _check_acknowledged(acked, writes, from_node, through_seq)
    return ForkPlan(
        origin=origin,
        from_node=from_node,
        graph_hash=head.graph_hash,
        through_seq=through_seq,
        prefix=prefix,
        writes=writes,
        acknowledged=tuple(acked),
    )


def _check_reconciled(view: RunView, origin: str) -> None:
    """Refuse an origin parked at a write nobody knows the outcome of (its prefix may hold it)."""
    if view.state is RunState.NEEDS_RECONCILIATION:
        intent = view.pending.intent_json()
        raise ForkRefused(
            ErrorCode.ORIGIN_NEEDS_RECONCILIATION,
            f"run {origin} is parked at a write of unknown outcome ({intent['tool']} at seq "
            f"{intent['seq']})",
            details={"intent": intent},
            next_step=NextStep(kind=StepKind.RESOLVE_THEN_FORK, run=origin),
        )


def _entry_of(log: list[Envelope], from_node: str, origin: str) -> int:
    """The seq of ``from_node``'s first ``NodeEntered``, or the refusal naming what was entered."""
    for envelope in log:
        if isinstance(envelope.event, NodeEntered) and envelope.event.node == from_node:
            return envelope.seq
    entered = list(dict.fromkeys(e.event.node for e in log if isinstance(e.event, NodeEntered)))
    raise ForkRefused(
        ErrorCode.INVALID_FORK_NODE,
        f"run {origin} never entered node {excerpt(from_node)!r}; it entered "
        + (", ".join(repr(node) for node in entered) if entered else "no node yet"),
        details={"entered": entered},
    )


def _recorded_write(envelope: Envelope, seq: int, *, in_child: bool) -> RecordedWrite:
    event = envelope.event
    return RecordedWrite(
        seq=seq,
        tool=event.tool,
        input=event.input,
        idempotency_key=event.idempotency_key,
        recorded_at=envelope.recorded_at,
        run=envelope.run_id if in_child else None,
        run_seq=envelope.seq if in_child else None,
    )


def _rewalked_writes(
    log: list[Envelope], entry: int, map_items: Mapping[int, Sequence[Sequence[Envelope]]]
) -> tuple[RecordedWrite, ...]:
    """The writes from ``entry`` on: the log's own, and those of the child runs of a map entered
    there (listed under that map's entry seq), in seq order."""
    # A pinned agent node's write answered from its baseline was never performed, and the fork
    # walks the same files, so it is answered from the baseline again: no hazard.
    answered = {
        e.event.seq
        for e in log[entry:]
        if isinstance(e.event, ToolCallCompleted) and e.event.baseline is not None
    }
    writes = [
        _recorded_write(e, e.seq, in_child=False)
        for e in log[entry:]
        if _is_write(e) and e.seq not in answered
    ]
    for seq, logs in map_items.items():
        if seq >= entry:
            writes += [
                _recorded_write(e, seq, in_child=True)
                for item_log in logs
                for e in item_log
                if _is_write(e)
            ]
    return tuple(sorted(writes, key=lambda w: (w.seq, w.run or "", w.run_seq or 0)))


def _check_acknowledged(
    acked: list[int], writes: tuple[RecordedWrite, ...], from_node: str, through_seq: int
) -> None:
    """Refuse an acknowledgement of a seq that is no write the fork re-walks."""
    segment = {write.seq for write in writes}
    stray = [seq for seq in acked if seq not in segment]
    if stray:
        held = ", ".join(str(seq) for seq in sorted(segment)) or "none"
        raise ForkRefused(
            ErrorCode.BAD_REQUEST,
            f"`acknowledge_writes` names seq {', '.join(str(s) for s in stray)}, which is not a "
            f"write the fork re-walks from node {from_node!r} (the writes after seq "
            f"{through_seq} are at seq {held})",
            details={"not_writes": stray},
        )


def _is_write(envelope: Envelope) -> bool:
    event = envelope.event
    return isinstance(event, ToolCallRequested) and event.effect == Effect.WRITE


def _check_between_nodes(prefix_view: RunView, origin: str, through_seq: int) -> None:
    # A legal log enters a node only while running with nothing open; a log that says otherwise
    # was not written through the guard, and copying it would give the child a broken start.
    if (
        prefix_view.state is not RunState.RUNNING
        or prefix_view.pending is not None
        or prefix_view.open_node is not None
    ):
        raise ForkRefused(
            ErrorCode.DIVERGENCE,
            f"run {origin}'s log is not between two nodes at seq {through_seq} "
            f"(it is {prefix_view.state.value} there); it cannot be forked",
        )


def fork_head(plan: ForkPlan) -> list[Event]:
    """The child's first append: its ``GraphRunStarted`` (the origin's input, labels and flow
    files, and ``forked_from``), then the prefix's events after the origin's head, each at the
    seq it had in the origin (1..``through_seq``)."""
    head = plan.prefix[0].event
    assert isinstance(head, GraphRunStarted)
    return [
        GraphRunStarted(
            graph_hash=plan.graph_hash,
            input=head.input,
            labels=head.labels,
            forked_from=plan.forked_from,
            # A flow run's fork walks the same files, kept with the origin.
            flow=head.flow,
        ),
        *(envelope.event for envelope in plan.prefix[1:]),
    ]
