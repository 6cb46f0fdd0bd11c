"""The events a run records (the payload codec they share is ``_event_codec``'s).

Rules of this module:

* Every kind a run can record is a frozen, slotted, keyword-only dataclass
  that checks its own fields when built, so an ill-typed event cannot exist.
* A payload is strict: an unknown field, a missing required field, or an
  optional field sent as ``null`` is a ``MalformedEvent``. Optional fields are
  absent when unset, never ``null``.
* Payload keys are written in declaration order, so the same event always
  encodes to the same bytes.
* An intent's payload names its own position: the control-plane spec writes
  ``ModelCallRequested { seq, request_hash, request_body? }`` and
  ``ToolCallRequested { seq, tool, input, effect, idempotency_key }``, so a
  reader holding only a payload can still match a completion's ``seq`` to its
  intent. That ``seq`` is a copy of the envelope's, not a fact of the event
  (the event is built before its position is known), so it lives on the wire
  only: ``payload_at(seq)`` writes it first, and ``from_payload`` checks it
  against the position and drops it. A payload without it is read as it was
  always written before (stores from before this rule still load); one whose
  ``seq`` is not its position is malformed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from ._event_checks import (
    check_actor,
    check_exact_keys,
    check_instant,
    check_number,
    check_seq,
    check_str,
    check_usage,
    malformed,
)
from ._event_codec import Event
from ._event_kinds import BUDGET_KINDS, Actor, Effect, EventKind
from ._labels import NOT_A_LABEL_MAP, is_label_map


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted(Event):
    KIND: ClassVar[EventKind] = EventKind.RUN_STARTED
    optional: ClassVar[frozenset[str]] = frozenset({"labels", "driven_by", "replay_of"})

    agent_def_hash: str
    input: Any
    labels: dict | None = None
    driven_by: Actor | None = None
    # A re-run: the run whose recorded model calls this one must reproduce.
    # Ours, beyond the spec's RunStarted: absent on every other run, so a
    # spec-written reader never meets it unless it asked for a re-run.
    replay_of: str | None = None

    def __post_init__(self) -> None:
        check_str(self.KIND, "agent_def_hash", self.agent_def_hash)
        if self.labels is not None and not is_label_map(self.labels):
            raise malformed(self.KIND, NOT_A_LABEL_MAP)
        check_actor(self, "driven_by", Actor.CLIENT)
        if self.replay_of is not None:
            check_str(self.KIND, "replay_of", self.replay_of)
            if self.driven_by is not None:
                raise malformed(self.KIND, "a client-driven run cannot be a re-run (`replay_of`)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallRequested(Event):
    KIND: ClassVar[EventKind] = EventKind.MODEL_CALL_REQUESTED
    positioned: ClassVar[bool] = True
    optional: ClassVar[frozenset[str]] = frozenset({"request_body", "performed_by"})

    request_hash: str
    request_body: Any = None
    performed_by: Actor | None = None

    def __post_init__(self) -> None:
        check_str(self.KIND, "request_hash", self.request_hash)
        check_actor(self, "performed_by", Actor.CLIENT)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallCompleted(Event):
    KIND: ClassVar[EventKind] = EventKind.MODEL_CALL_COMPLETED
    optional: ClassVar[frozenset[str]] = frozenset({"baseline"})

    seq: int
    response: Any
    usage: dict
    # A pinned agent node's call answered from the baseline at this path: nothing was sent.
    baseline: str | None = None

    def __post_init__(self) -> None:
        check_seq(self.KIND, "seq", self.seq)
        check_usage(self.KIND, self.usage)
        if self.baseline is not None:
            check_str(self.KIND, "baseline", self.baseline)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRequested(Event):
    KIND: ClassVar[EventKind] = EventKind.TOOL_CALL_REQUESTED
    positioned: ClassVar[bool] = True
    optional: ClassVar[frozenset[str]] = frozenset({"performed_by"})

    tool: str
    input: Any
    effect: str
    idempotency_key: str | None
    performed_by: Actor | None = None

    def __post_init__(self) -> None:
        check_str(self.KIND, "tool", self.tool)
        if self.effect not in Effect.__members__.values():
            raise malformed(self.KIND, "`effect` must be one of read, idempotent, write")
        if self.idempotency_key is not None:
            check_str(self.KIND, "idempotency_key", self.idempotency_key)
        check_actor(self, "performed_by", Actor.CLIENT)


# The spec says a deduplicated completion names what it copied; this is the
# shape we give that name: the run and seq of the intent whose completion was copied.
_DEDUP_KEYS = frozenset({"run_id", "seq"})
# The evidence a probe-settled completion carries: the read it ran and what it answered.
PROBE_KEYS = frozenset({"tool", "input", "answer"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallCompleted(Event):
    KIND: ClassVar[EventKind] = EventKind.TOOL_CALL_COMPLETED
    optional: ClassVar[frozenset[str]] = frozenset(
        {"settled_by", "deduplicated_from", "probe", "baseline"}
    )

    seq: int
    output: Any
    settled_by: Actor | None = None
    deduplicated_from: dict | None = None
    # With ``settled_by: "probe"`` only: the probe's own call, as evidence.
    probe: dict | None = None
    # A pinned agent node's call answered from the baseline at this path: nothing was performed.
    baseline: str | None = None

    def __post_init__(self) -> None:
        check_seq(self.KIND, "seq", self.seq)
        if self.baseline is not None:
            check_str(self.KIND, "baseline", self.baseline)
        check_actor(self, "settled_by", Actor.OPERATOR, Actor.PROBE)
        if (self.probe is not None) != (self.settled_by == Actor.PROBE):
            raise malformed(self.KIND, '`probe` is present exactly when `settled_by` is "probe"')
        if self.probe is not None:
            check_exact_keys(self.KIND, "probe", self.probe, PROBE_KEYS)
            check_str(self.KIND, "probe.tool", self.probe["tool"])
        if self.deduplicated_from is not None:
            check_exact_keys(self.KIND, "deduplicated_from", self.deduplicated_from, _DEDUP_KEYS)
            check_str(self.KIND, "deduplicated_from.run_id", self.deduplicated_from["run_id"])
            check_seq(self.KIND, "deduplicated_from.seq", self.deduplicated_from["seq"])


@dataclass(frozen=True, slots=True, kw_only=True)
class NowObserved(Event):
    KIND: ClassVar[EventKind] = EventKind.NOW_OBSERVED

    now: str

    def __post_init__(self) -> None:
        check_instant(self.KIND, "now", self.now)


@dataclass(frozen=True, slots=True, kw_only=True)
class RandomObserved(Event):
    KIND: ClassVar[EventKind] = EventKind.RANDOM_OBSERVED

    value: str

    def __post_init__(self) -> None:
        check_str(self.KIND, "value", self.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspended(Event):
    KIND: ClassVar[EventKind] = EventKind.SUSPENDED
    optional: ClassVar[frozenset[str]] = frozenset({"kind"})

    reason: str
    input_schema: dict
    kind: str | None = None

    def __post_init__(self) -> None:
        check_str(self.KIND, "reason", self.reason)
        if not isinstance(self.input_schema, dict):
            raise malformed(self.KIND, "`input_schema` must be a JSON schema object")
        if self.kind is not None and self.kind != "signal":
            raise malformed(self.KIND, '`kind` is "signal" or absent')


@dataclass(frozen=True, slots=True, kw_only=True)
class Resumed(Event):
    KIND: ClassVar[EventKind] = EventKind.RESUMED

    input: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class SleepStarted(Event):
    KIND: ClassVar[EventKind] = EventKind.SLEEP_STARTED

    wake_at: str

    def __post_init__(self) -> None:
        check_instant(self.KIND, "wake_at", self.wake_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class SleepCompleted(Event):
    KIND: ClassVar[EventKind] = EventKind.SLEEP_COMPLETED


_BUDGET_KEYS = frozenset({"kind", "limit"})


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetExceeded(Event):
    KIND: ClassVar[EventKind] = EventKind.BUDGET_EXCEEDED

    budget: dict
    observed: int | float

    def __post_init__(self) -> None:
        check_exact_keys(self.KIND, "budget", self.budget, _BUDGET_KEYS)
        if self.budget["kind"] not in BUDGET_KINDS:
            raise malformed(self.KIND, f"`budget.kind` must be one of {', '.join(BUDGET_KINDS)}")
        check_number(self.KIND, "budget.limit", self.budget["limit"])
        check_number(self.KIND, "observed", self.observed)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompleted(Event):
    KIND: ClassVar[EventKind] = EventKind.RUN_COMPLETED

    output: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailed(Event):
    KIND: ClassVar[EventKind] = EventKind.RUN_FAILED

    error: str

    def __post_init__(self) -> None:
        check_str(self.KIND, "error", self.error)


_UNRESOLVED_KEYS = frozenset({"seq", "tool"})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunAbandoned(Event):
    KIND: ClassVar[EventKind] = EventKind.RUN_ABANDONED
    optional: ClassVar[frozenset[str]] = frozenset({"reason", "unresolved_write"})

    reason: str | None = None
    unresolved_write: dict | None = None

    def __post_init__(self) -> None:
        if self.reason is not None:
            check_str(self.KIND, "reason", self.reason, allow_empty=True)
        if self.unresolved_write is not None:
            check_exact_keys(self.KIND, "unresolved_write", self.unresolved_write, _UNRESOLVED_KEYS)
            check_seq(self.KIND, "unresolved_write.seq", self.unresolved_write["seq"])
            check_str(self.KIND, "unresolved_write.tool", self.unresolved_write["tool"])


# The origin a fork's head names: the run it was cut from, the last origin seq its prefix copies,
# the node it re-walks from, the graph both share, and the origin writes the operator let re-fire.
FORK_ORIGIN_KEYS = frozenset(
    {"run_id", "through_seq", "from_node", "graph_hash", "acknowledged_writes"}
)


def _fork_origin(kind: str, origin: Any) -> None:
    check_exact_keys(kind, "forked_from", origin, FORK_ORIGIN_KEYS)
    check_str(kind, "forked_from.run_id", origin["run_id"])
    check_seq(kind, "forked_from.through_seq", origin["through_seq"])
    check_str(kind, "forked_from.from_node", origin["from_node"])
    check_str(kind, "forked_from.graph_hash", origin["graph_hash"])
    writes = origin["acknowledged_writes"]
    if not isinstance(writes, list):
        raise malformed(kind, "`forked_from.acknowledged_writes` must be a list of seqs")
    for seq in writes:
        check_seq(kind, "forked_from.acknowledged_writes[]", seq)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphRunStarted(Event):
    """The head of a graph run: the graph it walks (by hash) and the run's input; for a run of
    a flow file, ``flow`` names the manifest of its files (kept content-addressed with it)."""

    KIND: ClassVar[EventKind] = EventKind.GRAPH_RUN_STARTED
    optional: ClassVar[frozenset[str]] = frozenset({"labels", "forked_from", "flow"})

    graph_hash: str
    input: Any
    labels: dict | None = None
    forked_from: dict | None = None
    flow: str | None = None

    def __post_init__(self) -> None:
        check_str(self.KIND, "graph_hash", self.graph_hash)
        if self.labels is not None and not is_label_map(self.labels):
            raise malformed(self.KIND, NOT_A_LABEL_MAP)
        if self.forked_from is not None:
            _fork_origin(self.KIND, self.forked_from)
        if self.flow is not None:
            check_str(self.KIND, "flow", self.flow)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEntered(Event):
    """The walk reached ``node``; ``input`` is what the node was given, resolved."""

    KIND: ClassVar[EventKind] = EventKind.NODE_ENTERED

    node: str
    input: Any

    def __post_init__(self) -> None:
        check_str(self.KIND, "node", self.node)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeExited(Event):
    """``node`` finished with ``output``; a branch also names the case it took."""

    KIND: ClassVar[EventKind] = EventKind.NODE_EXITED
    optional: ClassVar[frozenset[str]] = frozenset({"branch_case"})

    node: str
    output: Any
    branch_case: str | None = None

    def __post_init__(self) -> None:
        check_str(self.KIND, "node", self.node)
        if self.branch_case is not None:
            check_str(self.KIND, "branch_case", self.branch_case)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSkipped(Event):
    """The walk passed ``node`` by: no live edge leads into it."""

    KIND: ClassVar[EventKind] = EventKind.NODE_SKIPPED

    node: str
    reason: str

    def __post_init__(self) -> None:
        check_str(self.KIND, "node", self.node)
        check_str(self.KIND, "reason", self.reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class MapItemCompleted(Event):
    """Item ``index`` of the open ``map`` node finished in the child run ``run_id``; ``usage`` is
    what that child's model calls used (an agent item's), counted into the graph run's own."""

    KIND: ClassVar[EventKind] = EventKind.MAP_ITEM_COMPLETED
    optional: ClassVar[frozenset[str]] = frozenset({"usage"})

    node: str
    index: int
    run_id: str
    output: Any
    usage: dict | None = None

    def __post_init__(self) -> None:
        check_str(self.KIND, "node", self.node)
        check_seq(self.KIND, "index", self.index)
        check_str(self.KIND, "run_id", self.run_id)
        if self.usage is not None:
            check_usage(self.KIND, self.usage)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolsAttached(Event):
    """Registry tools and declared MCP servers (``mcp:<name>``) added to this run (and every
    child started after it) at run time, by ``by`` (``operator``, or ``agent`` for an agent's
    ``attach_tool``). It narrates, never calls: a replay passes it wherever it stands, and a
    conversation offers its tools from its next model call on."""

    KIND: ClassVar[EventKind] = EventKind.TOOLS_ATTACHED

    tools: list
    by: str

    def __post_init__(self) -> None:
        if not isinstance(self.tools, list) or not self.tools:
            raise malformed(self.KIND, "`tools` must be a non-empty array of tool names")
        for index, name in enumerate(self.tools):
            check_str(self.KIND, f"tools[{index}]", name)
        if self.by not in ("operator", "agent"):
            raise malformed(self.KIND, '`by` must be "operator" or "agent"')


def attached_tools(events: Iterable[Event]) -> tuple[str, ...]:
    """The tools the ``ToolsAttached`` among ``events`` attached, each once, in order."""
    names: dict[str, None] = {}
    for event in events:
        if isinstance(event, ToolsAttached):
            names.update(dict.fromkeys(event.tools))
    return tuple(names)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.KIND.value: cls
    for cls in (
        RunStarted,
        ModelCallRequested,
        ModelCallCompleted,
        ToolCallRequested,
        ToolCallCompleted,
        NowObserved,
        RandomObserved,
        Suspended,
        Resumed,
        SleepStarted,
        SleepCompleted,
        BudgetExceeded,
        RunCompleted,
        RunFailed,
        RunAbandoned,
        GraphRunStarted,
        NodeEntered,
        NodeExited,
        NodeSkipped,
        MapItemCompleted,
        ToolsAttached,
    )
}
