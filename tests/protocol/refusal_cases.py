"""The table of refusals: ``REFUSALS``, each a legal prefix, the illegal envelope after it, and
the reason the guard gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from salvor.protocol import (
    SCHEMA_VERSION,
    Envelope,
    Event,
    MapItemCompleted,
    NodeEntered,
    NodeExited,
    NodeSkipped,
    NowObserved,
    Resumed,
    RunAbandoned,
    RunCompleted,
    RunFailed,
    SleepCompleted,
    SleepStarted,
    Suspended,
)

from .event_builders import (
    GS,
    MODEL_STEP,
    OTHER_RUN,
    RUN,
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
    started,
    tool,
    tool_done,
    wrap,
    write,
)


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
