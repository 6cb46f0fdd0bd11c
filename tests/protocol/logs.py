"""Event builders and the shared tables of the protocol tests.

``VIEW_CASES`` is the one table of (legal log, expected view): it feeds the
fold tests, the step-by-step tests and the guard's acceptance tests.
``REFUSALS`` is the table of (legal prefix, illegal next envelope, reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from salvor.protocol import (
    SCHEMA_VERSION,
    BudgetExceeded,
    Envelope,
    Event,
    GraphRunStarted,
    MapItemCompleted,
    ModelCallCompleted,
    ModelCallRequested,
    NodeEntered,
    NodeExited,
    NodeSkipped,
    NowObserved,
    RandomObserved,
    Resumed,
    RunAbandoned,
    RunCompleted,
    RunFailed,
    RunStarted,
    RunState,
    RunView,
    SleepCompleted,
    SleepStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    format_instant,
)

RUN = "run-1"
OTHER_RUN = "run-2"
AGENT = "sha256:" + "a" * 64
REQUEST = "sha256:" + "b" * 64
REQUEST_2 = "sha256:" + "c" * 64
GRAPH = "sha256:" + "d" * 64
WAKE_AT = "2026-08-14T09:00:00Z"
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

APPROVAL_SCHEMA = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}},
}
# `required` with no `type`: read as asking for an object.
UNTYPED_SCHEMA = {"required": ["approved"]}


def recorded_at(seq: int) -> str:
    return format_instant(EPOCH + timedelta(seconds=seq))


def envelope(
    seq: int,
    event: Event,
    *,
    run_id: str = RUN,
    schema_version: int = SCHEMA_VERSION,
) -> Envelope:
    return Envelope(
        run_id=run_id,
        seq=seq,
        schema_version=schema_version,
        recorded_at=recorded_at(seq),
        event=event,
    )


def wrap(events: list[Event], *, run_id: str = RUN) -> list[Envelope]:
    """Envelopes for ``events`` with contiguous seq from 0."""
    return [envelope(seq, event, run_id=run_id) for seq, event in enumerate(events)]


# Event shorthands: the common shape, overridable by keyword.


def started(**fields: Any) -> RunStarted:
    return RunStarted(**{"agent_def_hash": AGENT, "input": {"claim": "C-7"}} | fields)


def graph_started(**fields: Any) -> GraphRunStarted:
    return GraphRunStarted(**{"graph_hash": GRAPH, "input": {"topic": "tides"}, **fields})


def model(**fields: Any) -> ModelCallRequested:
    return ModelCallRequested(**{"request_hash": REQUEST} | fields)


def model_done(seq: int, input_tokens: int = 10, output_tokens: int = 5) -> ModelCallCompleted:
    return ModelCallCompleted(
        seq=seq,
        response={"content": [{"type": "text", "text": "ok"}]},
        usage={"input_tokens": input_tokens, "output_tokens": output_tokens},
    )


def tool(name: str = "lookup", effect: str = "read", **fields: Any) -> ToolCallRequested:
    base = {"tool": name, "input": {"invoice": "A-1"}, "effect": effect, "idempotency_key": None}
    return ToolCallRequested(**base | fields)


def write(name: str = "charge", **fields: Any) -> ToolCallRequested:
    return tool(name, "write", **{"input": {"amount": 10}} | fields)


def tool_done(seq: int, output: Any = None, **fields: Any) -> ToolCallCompleted:
    return ToolCallCompleted(
        seq=seq, output={"found": True} if output is None else output, **fields
    )


def gate(schema: dict | None = None, **fields: Any) -> Suspended:
    return Suspended(
        reason="approve the refund",
        input_schema=APPROVAL_SCHEMA if schema is None else schema,
        **fields,
    )


def over_budget(kind: str = "tokens", limit: float = 400, observed: float = 400) -> BudgetExceeded:
    return BudgetExceeded(budget={"kind": kind, "limit": limit}, observed=observed)


def pending_model(seq: int, request_hash: str = REQUEST) -> dict:
    return {"kind": "model", "seq": seq, "request_hash": request_hash}


def pending_tool(
    seq: int,
    name: str = "lookup",
    effect: str = "read",
    tool_input: Any = None,
    idempotency_key: str | None = None,
) -> dict:
    return {
        "kind": "tool",
        "seq": seq,
        "tool": name,
        "input": {"invoice": "A-1"} if tool_input is None else tool_input,
        "effect": effect,
        "idempotency_key": idempotency_key,
    }


# --------------------------------------------------------------------------
# The table of (legal log, expected view)


@dataclass(frozen=True)
class ViewCase:
    name: str
    events: list[Event]
    status: dict
    usage: tuple[int, int] = (0, 0)
    pending: dict | None = None
    step_count: int = 0
    # Further RunView attributes this case pins (labels, driven_by, ...).
    extra: dict = field(default_factory=dict)

    @property
    def log(self) -> list[Envelope]:
        return wrap(self.events)

    @property
    def next_seq(self) -> int:
        # A legal log is contiguous from 0, so the next seq is its length.
        return len(self.events)


S = started()
MODEL_STEP = [S, model(), model_done(1)]  # seq 0..2: one completed model call, usage 10/5
SIGNAL_SCHEMA = {"type": "object", "required": ["payment_id"]}

VIEW_CASES: list[ViewCase] = [
    ViewCase("not_started: empty log", [], {"state": "not_started"}),
    ViewCase(
        "running: just started",
        [started(labels={"build": "42", "env": "prod"})],
        {"state": "running"},
        extra={
            "labels": {"build": "42", "env": "prod"},
            "agent_def_hash": AGENT,
            "input": {"claim": "C-7"},
            "driven_by": None,
        },
    ),
    ViewCase(
        "running: a re-run names its origin",
        [started(replay_of="0b5c1a52-6a7e-4d0e-9a52-3f7c2a9e0d11")],
        {"state": "running"},
        extra={"replay_of": "0b5c1a52-6a7e-4d0e-9a52-3f7c2a9e0d11", "driven_by": None},
    ),
    ViewCase(
        "running: started with an explicit empty label set",
        [started(labels={})],
        {"state": "running"},
        extra={"labels": {}},
    ),
    ViewCase(
        "running: after one model call",
        [S, model(), model_done(1, 250, 50)],
        {"state": "running"},
        usage=(250, 50),
        step_count=1,
    ),
    ViewCase(
        "awaiting_model",
        [S, model()],
        {"state": "awaiting_model"},
        pending=pending_model(1),
        step_count=1,
    ),
    ViewCase(
        "awaiting_model: client-driven, client-performed, with its request body",
        [started(driven_by="client"), model(performed_by="client", request_body={"m": "x"})],
        {"state": "awaiting_model"},
        pending=pending_model(1),
        step_count=1,
        extra={"driven_by": "client", "labels": None},
    ),
    ViewCase(
        "awaiting_tool: a read",
        [*MODEL_STEP, tool()],
        {"state": "awaiting_tool"},
        usage=(10, 5),
        pending=pending_tool(3),
        step_count=1,
    ),
    ViewCase(
        "awaiting_tool: idempotent with a key",
        [*MODEL_STEP, tool("pay", "idempotent", idempotency_key="claim-7")],
        {"state": "awaiting_tool"},
        usage=(10, 5),
        pending=pending_tool(3, "pay", "idempotent", idempotency_key="claim-7"),
        step_count=1,
    ),
    ViewCase(
        "needs_reconciliation: a write with no completion",
        [*MODEL_STEP, write()],
        {"state": "needs_reconciliation"},
        usage=(10, 5),
        pending=pending_tool(3, "charge", "write", {"amount": 10}),
        step_count=1,
    ),
    ViewCase(
        "needs_reconciliation: a client-performed write",
        [S, write(performed_by="client", idempotency_key="k-1")],
        {"state": "needs_reconciliation"},
        pending=pending_tool(1, "charge", "write", {"amount": 10}, "k-1"),
    ),
    ViewCase(
        "running: a write resolved by an operator",
        [*MODEL_STEP, write(), tool_done(3, {"charged": 10}, settled_by="operator")],
        {"state": "running"},
        usage=(10, 5),
        step_count=1,
        extra={"tool_calls_completed": 1},
    ),
    ViewCase(
        "running: a write its probe found landed",
        [
            *MODEL_STEP,
            write(),
            tool_done(
                3,
                {"charged": 10},
                settled_by="probe",
                probe={"tool": "find_charge", "input": {"id": 1}, "answer": {"found": True}},
            ),
        ],
        {"state": "running"},
        usage=(10, 5),
        step_count=1,
        extra={"tool_calls_completed": 1},
    ),
    ViewCase(
        "running: a deduplicated completion",
        [S, tool(), tool_done(1, deduplicated_from={"run_id": OTHER_RUN, "seq": 4})],
        {"state": "running"},
        extra={"tool_calls_completed": 1},
    ),
    ViewCase(
        "suspended: a human gate",
        [*MODEL_STEP, gate()],
        {"state": "suspended", "reason": "approve the refund", "input_schema": APPROVAL_SCHEMA},
        usage=(10, 5),
        step_count=1,
    ),
    ViewCase(
        "suspended: waiting on a signal",
        [S, Suspended(reason="await payment", input_schema=SIGNAL_SCHEMA, kind="signal")],
        {
            "state": "suspended",
            "reason": "await payment",
            "input_schema": SIGNAL_SCHEMA,
            "kind": "signal",
        },
    ),
    ViewCase(
        "running: resumed through a gate",
        [S, gate(), Resumed(input={"approved": True})],
        {"state": "running"},
    ),
    ViewCase(
        "running: resumed through an untyped gate, the field null",
        [S, gate(UNTYPED_SCHEMA), Resumed(input={"approved": None})],
        {"state": "running"},
    ),
    ViewCase(
        "running: resumed with null through a schema that accepts anything",
        [S, gate({}), Resumed(input=None)],
        {"state": "running"},
    ),
    ViewCase(
        "sleeping",
        [S, NowObserved(now="2026-08-14T08:00:00Z"), SleepStarted(wake_at=WAKE_AT)],
        {"state": "sleeping", "wake_at": WAKE_AT},
        extra={"first_now": "2026-08-14T08:00:00Z", "last_now": "2026-08-14T08:00:00Z"},
    ),
    ViewCase(
        "sleeping: a tool started the timer, and the clock was read while asleep",
        [
            S,
            tool("snooze"),
            tool_done(1, {"__salvor_sleep": {"wake_at": WAKE_AT}}),
            SleepStarted(wake_at=WAKE_AT),
            NowObserved(now="2026-08-14T08:30:00Z"),
        ],
        {"state": "sleeping", "wake_at": WAKE_AT},
    ),
    ViewCase(
        "running: woke from a sleep",
        [S, SleepStarted(wake_at=WAKE_AT), NowObserved(now=WAKE_AT), SleepCompleted()],
        {"state": "running"},
    ),
    ViewCase(
        "budget_exceeded",
        [S, model(), model_done(1, 300, 100), over_budget("tokens", 400, 400)],
        {"state": "budget_exceeded", "budget": {"kind": "tokens", "limit": 400}, "observed": 400},
        usage=(300, 100),
        step_count=1,
    ),
    ViewCase(
        "budget_exceeded: a float cost budget",
        [S, over_budget("cost_usd", 2.5, 2.75)],
        {
            "state": "budget_exceeded",
            "budget": {"kind": "cost_usd", "limit": 2.5},
            "observed": 2.75,
        },
    ),
    ViewCase(
        "running: a budget extended twice",
        [
            S,
            over_budget("steps", 2, 2),
            Resumed(input={"extend_by": 3}),
            over_budget("steps", 5, 5),
            Resumed(input={"extend_by": 0.5}),
        ],
        {"state": "running"},
        extra={"budget_extensions": {"steps": 3.5}},
    ),
    ViewCase(
        "running: two steps accumulate usage",
        [*MODEL_STEP, tool(), tool_done(3), model(request_hash=REQUEST_2), model_done(5, 20, 7)],
        {"state": "running"},
        usage=(30, 12),
        step_count=2,
        extra={"tool_calls_completed": 1},
    ),
    ViewCase(
        "running: a random value observed",
        [S, RandomObserved(value="4")],
        {"state": "running"},
    ),
    ViewCase(
        "completed",
        [*MODEL_STEP, RunCompleted(output={"verdict": "refund"})],
        {"state": "completed", "output": {"verdict": "refund"}},
        usage=(10, 5),
        step_count=1,
    ),
    ViewCase(
        "completed: with a null output",
        [S, RunCompleted(output=None)],
        {"state": "completed", "output": None},
    ),
    ViewCase(
        "failed",
        [S, RunFailed(error="provider refused the request")],
        {"state": "failed", "error": "provider refused the request"},
    ),
    ViewCase(
        "failed: with a model intent open",
        [S, model(), RunFailed(error="gave up")],
        {"state": "failed", "error": "gave up"},
        step_count=1,
    ),
    ViewCase(
        "failed: with a read intent open",
        [S, tool(), RunFailed(error="gave up")],
        {"state": "failed", "error": "gave up"},
    ),
    ViewCase(
        "abandoned: with a reason",
        [S, gate(), RunAbandoned(reason="husk is dead forever")],
        {"state": "abandoned", "reason": "husk is dead forever"},
    ),
    ViewCase(
        "abandoned: with no reason",
        [S, RunAbandoned()],
        {"state": "abandoned"},
    ),
    ViewCase(
        "abandoned: with an empty reason",
        [S, SleepStarted(wake_at=WAKE_AT), RunAbandoned(reason="")],
        {"state": "abandoned", "reason": ""},
    ),
    ViewCase(
        "abandoned: over budget",
        [S, over_budget(), RunAbandoned(reason="too dear")],
        {"state": "abandoned", "reason": "too dear"},
    ),
    ViewCase(
        "abandoned: a model intent open",
        [S, model(), RunAbandoned()],
        {"state": "abandoned"},
        step_count=1,
    ),
    ViewCase(
        "abandoned: with an unresolved write",
        [*MODEL_STEP, write(), RunAbandoned(unresolved_write={"seq": 3, "tool": "charge"})],
        {"state": "abandoned", "unresolved_write": {"seq": 3, "tool": "charge"}},
        usage=(10, 5),
        step_count=1,
    ),
    ViewCase(
        "abandoned: with a reason and an unresolved write",
        [S, write(), RunAbandoned(reason="gone", unresolved_write={"seq": 1, "tool": "charge"})],
        {"state": "abandoned", "reason": "gone", "unresolved_write": {"seq": 1, "tool": "charge"}},
    ),
]

GS = graph_started()
FORK_ORIGIN = {
    "run_id": "origin",
    "through_seq": 3,
    "from_node": "publish",
    "graph_hash": GRAPH,
    "acknowledged_writes": [2],
}
VIEW_CASES += [
    ViewCase(
        "running: a graph run just started",
        [graph_started(labels={"build": "7"})],
        {"state": "running"},
        extra={
            "graph_hash": GRAPH,
            "agent_def_hash": None,
            "input": {"topic": "tides"},
            "labels": {"build": "7"},
            "open_node": None,
        },
    ),
    ViewCase(
        "running: a fork names its origin",
        [graph_started(forked_from=FORK_ORIGIN)],
        {"state": "running"},
        extra={"forked_from": FORK_ORIGIN},
    ),
    ViewCase(
        "running: a graph run inside an agent node's model call",
        [GS, NodeEntered(node="research", input="tides"), model()],
        {"state": "awaiting_model"},
        pending=pending_model(2),
        step_count=1,
        extra={"open_node": "research"},
    ),
    ViewCase(
        "running: a graph run between nodes",
        [
            GS,
            NodeEntered(node="route", input=True),
            NodeExited(node="route", output=True, branch_case="true"),
            NodeSkipped(node="reject", reason="another case was taken"),
            NodeEntered(node="each", input=[1, 2]),
            MapItemCompleted(node="each", index=1, run_id="child-1", output=2),
        ],
        {"state": "running"},
        extra={"open_node": "each"},
    ),
    ViewCase(
        "running: a graph run counts its map's agent items' usage, recorded with each item",
        [
            GS,
            NodeEntered(node="research", input="tides"),
            model(),
            model_done(2),
            NodeExited(node="research", output="notes"),
            NodeEntered(node="each", input=[1, 2, 3]),
            MapItemCompleted(
                node="each",
                index=2,
                run_id="child-2",
                output=3,
                usage={"input_tokens": 7, "output_tokens": 3},
            ),
            MapItemCompleted(
                node="each",
                index=0,
                run_id="child-0",
                output=1,
                usage={"input_tokens": 0, "output_tokens": 0},
            ),
            MapItemCompleted(node="each", index=1, run_id="child-1", output=2),
        ],
        {"state": "running"},
        usage=(17, 8),
        step_count=1,
        extra={"open_node": "each"},
    ),
    ViewCase(
        "suspended: a graph run at a gate",
        [GS, NodeEntered(node="approve", input=None), gate()],
        {"state": "suspended", "reason": "approve the refund", "input_schema": APPROVAL_SCHEMA},
        extra={"open_node": "approve"},
    ),
    ViewCase(
        "completed: a graph run",
        [
            GS,
            NodeEntered(node="research", input="tides"),
            NodeExited(node="research", output="notes"),
            RunCompleted(output={"research": "notes"}),
        ],
        {"state": "completed", "output": {"research": "notes"}},
        extra={"open_node": None},
    ),
]

# Every state of the status table has at least one case.
COVERED_STATES = {case.status["state"] for case in VIEW_CASES}


def legal_next(view: RunView) -> Envelope | None:
    """Some envelope the guard must accept after ``view``; None after a terminal event."""
    seq = view.next_seq
    state = view.state
    if state is RunState.NOT_STARTED:
        return envelope(seq, started())
    if state is RunState.RUNNING:
        return envelope(seq, RunCompleted(output="done"))
    if state is RunState.AWAITING_MODEL:
        return envelope(seq, model_done(view.pending.seq))
    if state in (RunState.AWAITING_TOOL, RunState.NEEDS_RECONCILIATION):
        return envelope(seq, tool_done(view.pending.seq))
    if state is RunState.SLEEPING:
        return envelope(seq, SleepCompleted())
    if state in (RunState.SUSPENDED, RunState.BUDGET_EXCEEDED):
        return envelope(seq, RunAbandoned(reason="no longer needed"))
    return None


# --------------------------------------------------------------------------
# The table of refusals: (legal prefix, illegal next envelope, reason)


@dataclass(frozen=True)
class Refusal:
    name: str
    prefix: list[Event]
    event: Event
    reason: str
    seq: int | None = None  # default: the next seq
    run_id: str = RUN
    schema_version: int = SCHEMA_VERSION

    @property
    def log(self) -> list[Envelope]:
        return wrap(self.prefix)

    @property
    def illegal(self) -> Envelope:
        seq = len(self.prefix) if self.seq is None else self.seq
        return envelope(seq, self.event, run_id=self.run_id, schema_version=self.schema_version)


ONE_OPEN = "still open (at most one open intent)"
LEGAL_KINDS = "the legal next kinds are"
TERMINAL = "nothing may follow a terminal event"

TERMINAL_PREFIXES = {
    "completed": [S, RunCompleted(output=1)],
    "failed": [S, RunFailed(error="x")],
    "abandoned": [S, RunAbandoned(reason="x")],
    "abandoned at a write": [
        S,
        write(),
        RunAbandoned(unresolved_write={"seq": 1, "tool": "charge"}),
    ],
}
AFTER_TERMINAL = {
    "RunStarted": started(),
    "ModelCallRequested": model(),
    "ToolCallCompleted": tool_done(1),
    "Resumed": Resumed(input={"approved": True}),
    "RunCompleted": RunCompleted(output=2),
    "RunFailed": RunFailed(error="y"),
    "RunAbandoned": RunAbandoned(),
    "NowObserved": NowObserved(now=WAKE_AT),
}

GATED = [S, gate()]
UNTYPED_GATED = [S, gate(UNTYPED_SCHEMA)]
OVER_BUDGET = [S, over_budget()]
AT_WRITE = [S, write()]
BUDGET = "a budget extension does not satisfy the recorded schema"


def _labels(count: int) -> dict:
    return {f"k{index}": "v" for index in range(count)}


REFUSALS: list[Refusal] = [
    # The head and the seq.
    Refusal("seq gap", [S], model(), "the next seq is 1", seq=2),
    Refusal("seq repeat", [S, model()], model_done(1), "the next seq is 2", seq=1),
    Refusal("seq far behind", [*MODEL_STEP], model(), "the next seq is 3", seq=0),
    Refusal("first event not at seq 0", [], started(), "the next seq is 0", seq=1),
    Refusal("wrong run_id", [S], model(), f"the log belongs to run {RUN}", run_id=OTHER_RUN),
    Refusal("wrong schema_version", [S], model(), "schema_version must be 1", schema_version=2),
    Refusal(
        "schema_version 0 at the head", [], started(), "schema_version must be 1", schema_version=0
    ),
    Refusal("log opening with a model call", [], model(), "a log must open with RunStarted"),
    Refusal(
        "log opening with RunCompleted", [], RunCompleted(output=1), "must open with RunStarted"
    ),
    Refusal("RunStarted at seq 1", [S], started(), LEGAL_KINDS),
    Refusal("RunStarted mid-run", [*MODEL_STEP], started(), LEGAL_KINDS),
    # Nothing after a terminal event.
    *[
        Refusal(f"{kind} after {name}", prefix, event, TERMINAL)
        for name, prefix in TERMINAL_PREFIXES.items()
        for kind, event in AFTER_TERMINAL.items()
    ],
    # At most one open intent.
    Refusal("model while model", [S, model()], model(), ONE_OPEN),
    Refusal("tool while model", [S, model()], tool(), ONE_OPEN),
    Refusal("model while tool", [S, tool()], model(), ONE_OPEN),
    Refusal("tool while tool", [S, tool()], tool(), ONE_OPEN),
    Refusal("tool while a write is open", AT_WRITE, tool(), ONE_OPEN),
    Refusal("model while a write is open", AT_WRITE, model(), ONE_OPEN),
    # Completions correlate with the open intent.
    Refusal(
        "model completion naming the wrong seq",
        [S, NowObserved(now=WAKE_AT), model()],
        model_done(1),
        "it must name the open model intent at seq 2",
    ),
    Refusal(
        "model completion naming a future seq",
        [S, model()],
        model_done(2),
        "it must name the open model intent at seq 1",
    ),
    Refusal(
        "tool completion naming the wrong seq",
        [S, tool()],
        tool_done(0),
        "it must name the open tool intent at seq 1",
    ),
    Refusal(
        "write completion naming the wrong seq",
        [*MODEL_STEP, write()],
        tool_done(1),
        "it must name the open tool intent at seq 3",
    ),
    Refusal(
        "tool completion while a model intent is open",
        [S, model()],
        tool_done(1),
        "the model intent at seq 1 must complete first",
    ),
    Refusal(
        "model completion while a tool intent is open",
        [S, tool()],
        model_done(1),
        "the tool intent at seq 1 must complete first",
    ),
    Refusal("model completion with no intent", [S], model_done(0), LEGAL_KINDS),
    Refusal("model completion twice", [*MODEL_STEP], model_done(1), LEGAL_KINDS),
    Refusal("tool completion with no intent", [S], tool_done(0), LEGAL_KINDS),
    Refusal(
        "RunCompleted with a tool intent open",
        [S, tool()],
        RunCompleted(output=1),
        "the tool intent at seq 1 must complete first",
    ),
    Refusal(
        "Suspended with a model intent open",
        [S, model()],
        gate(),
        "the model intent at seq 1 must complete first",
    ),
    # Resumed: only when parked, only with what the parking accepts.
    Refusal("Resumed when running", [S], Resumed(input={"approved": True}), LEGAL_KINDS),
    Refusal(
        "Resumed when sleeping", [S, SleepStarted(wake_at=WAKE_AT)], Resumed(input=1), LEGAL_KINDS
    ),
    Refusal(
        "Resumed when awaiting a model",
        [S, model()],
        Resumed(input=1),
        "the model intent at seq 1 must complete first",
    ),
    Refusal(
        "Resumed when needs_reconciliation",
        AT_WRITE,
        Resumed(input={"approved": True}),
        "the tool intent at seq 1 must complete first",
    ),
    Refusal(
        "Resumed twice", [*GATED, Resumed(input={"approved": True})], Resumed(input=1), LEGAL_KINDS
    ),
    Refusal(
        "Resumed input of the wrong type",
        GATED,
        Resumed(input={"approved": "yes"}),
        "$.approved must be boolean",
    ),
    Refusal(
        "Resumed input missing a required field",
        GATED,
        Resumed(input={}),
        "$ must contain ['approved'] properties",
    ),
    Refusal("untyped schema rejects null", UNTYPED_GATED, Resumed(input=None), "$ must be object"),
    Refusal("untyped schema rejects a number", UNTYPED_GATED, Resumed(input=7), "$ must be object"),
    Refusal(
        "untyped schema rejects a string", UNTYPED_GATED, Resumed(input="yes"), "$ must be object"
    ),
    Refusal(
        "untyped schema rejects an object without the field",
        UNTYPED_GATED,
        Resumed(input={"other": 1}),
        "$ must contain ['approved'] properties",
    ),
    Refusal(
        "properties-only schema rejects null",
        [S, gate({"properties": {"note": {"type": "string"}}})],
        Resumed(input=None),
        "$ must be object",
    ),
    Refusal(
        "signal schema rejects the wrong payload",
        [S, Suspended(reason="await payment", input_schema=SIGNAL_SCHEMA, kind="signal")],
        Resumed(input={"approved": True}),
        "$ must contain ['payment_id'] properties",
    ),
    # Budget extensions.
    Refusal("budget extension {}", OVER_BUDGET, Resumed(input={}), BUDGET),
    Refusal("budget extension of 0", OVER_BUDGET, Resumed(input={"extend_by": 0}), BUDGET),
    Refusal("negative budget extension", OVER_BUDGET, Resumed(input={"extend_by": -5}), BUDGET),
    Refusal(
        "budget extension with an extra key",
        OVER_BUDGET,
        Resumed(input={"extend_by": 5, "note": "x"}),
        BUDGET,
    ),
    Refusal("budget extension as a string", OVER_BUDGET, Resumed(input={"extend_by": "5"}), BUDGET),
    Refusal(
        "budget extension as a boolean", OVER_BUDGET, Resumed(input={"extend_by": True}), BUDGET
    ),
    Refusal("budget extension of null", OVER_BUDGET, Resumed(input=None), BUDGET),
    Refusal("budget extension as a bare number", OVER_BUDGET, Resumed(input=5), BUDGET),
    # Sleeping.
    Refusal("SleepCompleted without a sleep", [S], SleepCompleted(), LEGAL_KINDS),
    Refusal(
        "SleepStarted while sleeping",
        [S, SleepStarted(wake_at=WAKE_AT)],
        SleepStarted(wake_at=WAKE_AT),
        LEGAL_KINDS,
    ),
    Refusal(
        "a model call while sleeping", [S, SleepStarted(wake_at=WAKE_AT)], model(), LEGAL_KINDS
    ),
    Refusal("BudgetExceeded while suspended", GATED, over_budget(), LEGAL_KINDS),
    Refusal("RunCompleted while suspended", GATED, RunCompleted(output=1), LEGAL_KINDS),
    Refusal("RunFailed while over budget", OVER_BUDGET, RunFailed(error="x"), LEGAL_KINDS),
    # A write that may have landed.
    Refusal(
        "RunFailed while needs_reconciliation",
        AT_WRITE,
        RunFailed(error="x"),
        "the tool intent at seq 1 must complete first",
    ),
    Refusal(
        "RunAbandoned at a write without unresolved_write",
        AT_WRITE,
        RunAbandoned(reason="x"),
        "it must carry unresolved_write {'seq': 1, 'tool': 'charge'}",
    ),
    Refusal(
        "RunAbandoned at a write naming the wrong seq",
        AT_WRITE,
        RunAbandoned(unresolved_write={"seq": 0, "tool": "charge"}),
        "it must carry unresolved_write {'seq': 1, 'tool': 'charge'}",
    ),
    Refusal(
        "RunAbandoned at a write naming the wrong tool",
        AT_WRITE,
        RunAbandoned(unresolved_write={"seq": 1, "tool": "refund"}),
        "it must carry unresolved_write {'seq': 1, 'tool': 'charge'}",
    ),
    Refusal(
        "RunAbandoned with unresolved_write while running",
        [S],
        RunAbandoned(unresolved_write={"seq": 0, "tool": "charge"}),
        "unresolved_write is only for a run parked at a write",
    ),
    Refusal(
        "RunAbandoned with unresolved_write at a read",
        [S, tool()],
        RunAbandoned(unresolved_write={"seq": 1, "tool": "lookup"}),
        "unresolved_write is only for a run parked at a write",
    ),
    Refusal(
        "RunAbandoned with unresolved_write while suspended",
        GATED,
        RunAbandoned(unresolved_write={"seq": 1, "tool": "charge"}),
        "unresolved_write is only for a run parked at a write",
    ),
    # Labels.
    Refusal("17 labels", [], started(labels=_labels(17)), "at most 16 labels are allowed, got 17"),
    Refusal("65-byte label key", [], started(labels={"k" * 65: "v"}), "must be 1 to 64 bytes"),
    Refusal(
        "label key of 33 two-byte characters",
        [],
        started(labels={"é" * 33: "v"}),
        "must be 1 to 64 bytes",
    ),
    Refusal("empty label key", [], started(labels={"": "v"}), "must be 1 to 64 bytes"),
    Refusal("257-byte label value", [], started(labels={"k": "v" * 257}), "a value over 256 bytes"),
    # Suspended needs a schema that can check a resume.
    Refusal(
        "Suspended with an unknown type",
        [S],
        gate({"type": "nonsense"}),
        "input_schema is unusable",
    ),
    Refusal(
        "Suspended with a bad pattern", [S], gate({"type": "string", "pattern": "("}), "unusable"
    ),
    Refusal(
        "Suspended with a bad minLength", [S], gate({"minLength": "x"}), "input_schema is unusable"
    ),
    Refusal(
        "Suspended with a remote $ref",
        [S],
        gate({"$ref": "http://127.0.0.1:9/schema.json"}),
        "is not resolved",
    ),
    Refusal(
        "Suspended with a dangling local $ref",
        [S],
        gate({"$ref": "#/definitions/missing"}),
        "input_schema is unusable",
    ),
    # A graph run's walk: one node open at a time, and only a graph run narrates nodes.
    Refusal(
        "NodeEntered in an agent run",
        [S],
        NodeEntered(node="research", input=None),
        "only a graph run (GraphRunStarted) narrates nodes",
    ),
    Refusal(
        "NodeEntered while a node is open",
        [GS, NodeEntered(node="research", input=None)],
        NodeEntered(node="draft", input=None),
        "node 'research' is entered and not exited",
    ),
    Refusal(
        "NodeSkipped while a node is open",
        [GS, NodeEntered(node="research", input=None)],
        NodeSkipped(node="reject", reason="x"),
        "node 'research' is entered and not exited",
    ),
    Refusal(
        "NodeExited of another node",
        [GS, NodeEntered(node="research", input=None)],
        NodeExited(node="draft", output=None),
        "it names node 'draft', but 'research' is open",
    ),
    Refusal(
        "NodeExited with no node open",
        [GS],
        NodeExited(node="draft", output=None),
        "it names node 'draft', but no node is open",
    ),
    Refusal(
        "MapItemCompleted of a node that is not open",
        [GS, NodeEntered(node="each", input=[1])],
        MapItemCompleted(node="other", index=0, run_id="c", output=1),
        "it names node 'other', but 'each' is open",
    ),
    Refusal(
        "NodeExited inside a model call",
        [GS, NodeEntered(node="research", input=None), model()],
        NodeExited(node="research", output=None),
        "the model intent at seq 2 must complete first",
    ),
    Refusal("GraphRunStarted mid-run", [GS], graph_started(), LEGAL_KINDS),
]
