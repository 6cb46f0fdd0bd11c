"""The events an agent run records, and their payload codec.

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

import enum
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ._clock import parse_instant
from ._errors import MalformedEvent, excerpt
from ._labels import NOT_A_LABEL_MAP, is_label_map


class EventKind(enum.StrEnum):
    RUN_STARTED = "RunStarted"
    MODEL_CALL_REQUESTED = "ModelCallRequested"
    MODEL_CALL_COMPLETED = "ModelCallCompleted"
    TOOL_CALL_REQUESTED = "ToolCallRequested"
    TOOL_CALL_COMPLETED = "ToolCallCompleted"
    NOW_OBSERVED = "NowObserved"
    RANDOM_OBSERVED = "RandomObserved"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    SLEEP_STARTED = "SleepStarted"
    SLEEP_COMPLETED = "SleepCompleted"
    BUDGET_EXCEEDED = "BudgetExceeded"
    RUN_COMPLETED = "RunCompleted"
    RUN_FAILED = "RunFailed"
    RUN_ABANDONED = "RunAbandoned"
    # A graph run's head and the narration of its walk.
    GRAPH_RUN_STARTED = "GraphRunStarted"
    NODE_ENTERED = "NodeEntered"
    NODE_EXITED = "NodeExited"
    NODE_SKIPPED = "NodeSkipped"
    MAP_ITEM_COMPLETED = "MapItemCompleted"
    # Tools the operator (or an agent in edit mode) attached to the run's tree at run time.
    TOOLS_ATTACHED = "ToolsAttached"


class Effect(enum.StrEnum):
    """What executing a tool again would do to the world."""

    READ = "read"
    IDEMPOTENT = "idempotent"
    WRITE = "write"


class Actor(enum.StrEnum):
    """Who, besides the daemon, did what a payload records (absent: the daemon did it).

    ``performed_by`` and ``driven_by`` name the client (it performed the call,
    it drives the run); ``settled_by`` names who recorded a write's outcome
    after its intent was left open: the operator, by hand, or the write's
    probe, which read the world and found it landed.
    """

    CLIENT = "client"
    OPERATOR = "operator"
    PROBE = "probe"


BUDGET_KINDS = ("steps", "tokens", "cost_usd", "wall_time_seconds")

# The sentinel keys the runtime writes into a ToolCallCompleted output.
TOOL_ERROR_KEY = "__salvor_error"
TOOL_SLEEP_KEY = "__salvor_sleep"
TOOL_SUSPEND_KEY = "__salvor_suspend"


def _fail(kind: str, message: str) -> MalformedEvent:
    return MalformedEvent(f"{kind}: {message}")


def _actor(event: Event, name: str, *allowed: Actor) -> None:
    """Check an optional actor field is one of ``allowed`` or absent, and hold it as the member."""
    value = getattr(event, name)
    if value is not None:
        if value not in allowed:
            named = ", ".join(f'"{actor}"' for actor in allowed)
            raise _fail(event.KIND, f"`{name}` is {named} or absent")
        object.__setattr__(event, name, Actor(value))


def _str(kind: str, name: str, value: Any, *, allow_empty: bool = False) -> None:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise _fail(kind, f"`{name}` must be a non-empty string")


def _seq(kind: str, name: str, value: Any) -> None:
    if type(value) is not int or value < 0:
        raise _fail(kind, f"`{name}` must be a non-negative integer")


def _number(kind: str, name: str, value: Any) -> None:
    if type(value) not in (int, float) or value < 0:
        raise _fail(kind, f"`{name}` must be a non-negative number")


def _exact_keys(kind: str, name: str, value: Any, keys: frozenset[str]) -> None:
    if not isinstance(value, dict) or value.keys() != keys:
        raise _fail(kind, f"`{name}` must be an object with exactly {sorted(keys)}")


def _instant(kind: str, name: str, value: Any) -> None:
    try:
        parse_instant(value)
    except ValueError as exc:
        raise _fail(kind, f"`{name}` must be an RFC 3339 instant ({exc})") from None


_USAGE_KEYS = frozenset({"input_tokens", "output_tokens"})


def check_usage(kind: str, usage: Any) -> None:
    _exact_keys(kind, "usage", usage, _USAGE_KEYS)
    _seq(kind, "usage.input_tokens", usage["input_tokens"])
    _seq(kind, "usage.output_tokens", usage["output_tokens"])


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every recorded event; subclasses name their ``kind``."""

    KIND: ClassVar[EventKind]
    # Names of fields that are omitted from the payload when None.
    optional: ClassVar[frozenset[str]] = frozenset()
    # Whether the payload on the wire carries the event's own position as `seq`.
    positioned: ClassVar[bool] = False

    def to_payload(self) -> dict:
        """The payload object, optional fields omitted when unset."""
        payload = {}
        for name in self._field_names():
            value = getattr(self, name)
            if value is None and name in self.optional:
                continue
            payload[name] = value
        return payload

    def payload_at(self, seq: int) -> dict:
        """The payload as written at position ``seq``: an intent's names that position first."""
        if not self.positioned:
            return self.to_payload()
        return {"seq": seq, **self.to_payload()}

    @classmethod
    def _field_names(cls) -> tuple[str, ...]:
        cached = _FIELD_NAMES.get(cls)
        if cached is None:
            cached = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
        return cached

    @classmethod
    def from_payload(cls, payload: Any, *, seq: int) -> Event:
        """Build the event recorded at position ``seq`` from its payload object.

        Raises:
            MalformedEvent: the payload is not an object, has an unknown or
                missing field, carries an optional field as ``null``, a field
                has the wrong type, or an intent's ``seq`` is not ``seq``.
        """
        if not isinstance(payload, dict):
            raise _fail(cls.KIND, "payload must be an object")
        if cls.positioned and "seq" in payload:
            _seq(cls.KIND, "seq", payload["seq"])
            if payload["seq"] != seq:
                raise _fail(
                    cls.KIND, f"payload `seq` {payload['seq']} is not the event's position {seq}"
                )
            payload = payload.copy()  # the caller's object stays as it was sent
            del payload["seq"]
        names = cls._field_names()
        for key in payload:
            if key not in names:
                raise _fail(cls.KIND, f"unknown payload field `{excerpt(key)}`")
        for name in names:
            if name not in payload:
                if name not in cls.optional:
                    raise _fail(cls.KIND, f"payload is missing `{name}`")
            elif payload[name] is None and name in cls.optional:
                raise _fail(cls.KIND, f"`{name}` is absent when unset, never null")
        return cls(**payload)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


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
        _str(self.KIND, "agent_def_hash", self.agent_def_hash)
        if self.labels is not None and not is_label_map(self.labels):
            raise _fail(self.KIND, NOT_A_LABEL_MAP)
        _actor(self, "driven_by", Actor.CLIENT)
        if self.replay_of is not None:
            _str(self.KIND, "replay_of", self.replay_of)
            if self.driven_by is not None:
                raise _fail(self.KIND, "a client-driven run cannot be a re-run (`replay_of`)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallRequested(Event):
    KIND: ClassVar[EventKind] = EventKind.MODEL_CALL_REQUESTED
    positioned: ClassVar[bool] = True
    optional: ClassVar[frozenset[str]] = frozenset({"request_body", "performed_by"})

    request_hash: str
    request_body: Any = None
    performed_by: Actor | None = None

    def __post_init__(self) -> None:
        _str(self.KIND, "request_hash", self.request_hash)
        _actor(self, "performed_by", Actor.CLIENT)


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
        _seq(self.KIND, "seq", self.seq)
        check_usage(self.KIND, self.usage)
        if self.baseline is not None:
            _str(self.KIND, "baseline", self.baseline)


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
        _str(self.KIND, "tool", self.tool)
        if self.effect not in Effect.__members__.values():
            raise _fail(self.KIND, "`effect` must be one of read, idempotent, write")
        if self.idempotency_key is not None:
            _str(self.KIND, "idempotency_key", self.idempotency_key)
        _actor(self, "performed_by", Actor.CLIENT)


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
        _seq(self.KIND, "seq", self.seq)
        if self.baseline is not None:
            _str(self.KIND, "baseline", self.baseline)
        _actor(self, "settled_by", Actor.OPERATOR, Actor.PROBE)
        if (self.probe is not None) != (self.settled_by == Actor.PROBE):
            raise _fail(self.KIND, '`probe` is present exactly when `settled_by` is "probe"')
        if self.probe is not None:
            _exact_keys(self.KIND, "probe", self.probe, PROBE_KEYS)
            _str(self.KIND, "probe.tool", self.probe["tool"])
        if self.deduplicated_from is not None:
            _exact_keys(self.KIND, "deduplicated_from", self.deduplicated_from, _DEDUP_KEYS)
            _str(self.KIND, "deduplicated_from.run_id", self.deduplicated_from["run_id"])
            _seq(self.KIND, "deduplicated_from.seq", self.deduplicated_from["seq"])


@dataclass(frozen=True, slots=True, kw_only=True)
class NowObserved(Event):
    KIND: ClassVar[EventKind] = EventKind.NOW_OBSERVED

    now: str

    def __post_init__(self) -> None:
        _instant(self.KIND, "now", self.now)


@dataclass(frozen=True, slots=True, kw_only=True)
class RandomObserved(Event):
    KIND: ClassVar[EventKind] = EventKind.RANDOM_OBSERVED

    value: str

    def __post_init__(self) -> None:
        _str(self.KIND, "value", self.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspended(Event):
    KIND: ClassVar[EventKind] = EventKind.SUSPENDED
    optional: ClassVar[frozenset[str]] = frozenset({"kind"})

    reason: str
    input_schema: dict
    kind: str | None = None

    def __post_init__(self) -> None:
        _str(self.KIND, "reason", self.reason)
        if not isinstance(self.input_schema, dict):
            raise _fail(self.KIND, "`input_schema` must be a JSON schema object")
        if self.kind is not None and self.kind != "signal":
            raise _fail(self.KIND, '`kind` is "signal" or absent')


@dataclass(frozen=True, slots=True, kw_only=True)
class Resumed(Event):
    KIND: ClassVar[EventKind] = EventKind.RESUMED

    input: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class SleepStarted(Event):
    KIND: ClassVar[EventKind] = EventKind.SLEEP_STARTED

    wake_at: str

    def __post_init__(self) -> None:
        _instant(self.KIND, "wake_at", self.wake_at)


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
        _exact_keys(self.KIND, "budget", self.budget, _BUDGET_KEYS)
        if self.budget["kind"] not in BUDGET_KINDS:
            raise _fail(self.KIND, f"`budget.kind` must be one of {', '.join(BUDGET_KINDS)}")
        _number(self.KIND, "budget.limit", self.budget["limit"])
        _number(self.KIND, "observed", self.observed)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompleted(Event):
    KIND: ClassVar[EventKind] = EventKind.RUN_COMPLETED

    output: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailed(Event):
    KIND: ClassVar[EventKind] = EventKind.RUN_FAILED

    error: str

    def __post_init__(self) -> None:
        _str(self.KIND, "error", self.error)


_UNRESOLVED_KEYS = frozenset({"seq", "tool"})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunAbandoned(Event):
    KIND: ClassVar[EventKind] = EventKind.RUN_ABANDONED
    optional: ClassVar[frozenset[str]] = frozenset({"reason", "unresolved_write"})

    reason: str | None = None
    unresolved_write: dict | None = None

    def __post_init__(self) -> None:
        if self.reason is not None:
            _str(self.KIND, "reason", self.reason, allow_empty=True)
        if self.unresolved_write is not None:
            _exact_keys(self.KIND, "unresolved_write", self.unresolved_write, _UNRESOLVED_KEYS)
            _seq(self.KIND, "unresolved_write.seq", self.unresolved_write["seq"])
            _str(self.KIND, "unresolved_write.tool", self.unresolved_write["tool"])


# The origin a fork's head names: the run it was cut from, the last origin seq its prefix copies,
# the node it re-walks from, the graph both share, and the origin writes the operator let re-fire.
FORK_ORIGIN_KEYS = frozenset(
    {"run_id", "through_seq", "from_node", "graph_hash", "acknowledged_writes"}
)


def _fork_origin(kind: str, origin: Any) -> None:
    _exact_keys(kind, "forked_from", origin, FORK_ORIGIN_KEYS)
    _str(kind, "forked_from.run_id", origin["run_id"])
    _seq(kind, "forked_from.through_seq", origin["through_seq"])
    _str(kind, "forked_from.from_node", origin["from_node"])
    _str(kind, "forked_from.graph_hash", origin["graph_hash"])
    writes = origin["acknowledged_writes"]
    if not isinstance(writes, list):
        raise _fail(kind, "`forked_from.acknowledged_writes` must be a list of seqs")
    for seq in writes:
        _seq(kind, "forked_from.acknowledged_writes[]", seq)


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
        _str(self.KIND, "graph_hash", self.graph_hash)
        if self.labels is not None and not is_label_map(self.labels):
            raise _fail(self.KIND, NOT_A_LABEL_MAP)
        if self.forked_from is not None:
            _fork_origin(self.KIND, self.forked_from)
        if self.flow is not None:
            _str(self.KIND, "flow", self.flow)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEntered(Event):
    """The walk reached ``node``; ``input`` is what the node was given, resolved."""

    KIND: ClassVar[EventKind] = EventKind.NODE_ENTERED

    node: str
    input: Any

    def __post_init__(self) -> None:
        _str(self.KIND, "node", self.node)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeExited(Event):
    """``node`` finished with ``output``; a branch also names the case it took."""

    KIND: ClassVar[EventKind] = EventKind.NODE_EXITED
    optional: ClassVar[frozenset[str]] = frozenset({"branch_case"})

    node: str
    output: Any
    branch_case: str | None = None

    def __post_init__(self) -> None:
        _str(self.KIND, "node", self.node)
        if self.branch_case is not None:
            _str(self.KIND, "branch_case", self.branch_case)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSkipped(Event):
    """The walk passed ``node`` by: no live edge leads into it."""

    KIND: ClassVar[EventKind] = EventKind.NODE_SKIPPED

    node: str
    reason: str

    def __post_init__(self) -> None:
        _str(self.KIND, "node", self.node)
        _str(self.KIND, "reason", self.reason)


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
        _str(self.KIND, "node", self.node)
        _seq(self.KIND, "index", self.index)
        _str(self.KIND, "run_id", self.run_id)
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
            raise _fail(self.KIND, "`tools` must be a non-empty array of tool names")
        for index, name in enumerate(self.tools):
            _str(self.KIND, f"tools[{index}]", name)
        if self.by not in ("operator", "agent"):
            raise _fail(self.KIND, '`by` must be "operator" or "agent"')


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
