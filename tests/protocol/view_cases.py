"""The one table of (legal log, expected view): ``VIEW_CASES``.

It feeds the fold tests, the step-by-step tests and the guard's acceptance tests; ``legal_next``
gives, for any view, some envelope the guard must accept after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from salvor.protocol import (
    Envelope,
    Event,
    MapItemCompleted,
    NodeEntered,
    NodeExited,
    NodeSkipped,
    NowObserved,
    RandomObserved,
    Resumed,
    RunAbandoned,
    RunCompleted,
    RunFailed,
    RunState,
    RunView,
    SleepCompleted,
    SleepStarted,
    Suspended,
)

from .event_builders import (
    AGENT,
    APPROVAL_SCHEMA,
    GRAPH,
    GS,
    MODEL_STEP,
    OTHER_RUN,
    REQUEST_2,
    SIGNAL_SCHEMA,
    UNTYPED_SCHEMA,
    WAKE_AT,
    S,
    envelope,
    gate,
    graph_started,
    model,
    model_done,
    over_budget,
    pending_model,
    pending_tool,
    started,
    tool,
    tool_done,
    wrap,
    write,
)


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
