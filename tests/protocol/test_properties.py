"""Property tests: the fold is total, and the guard agrees with a reference
model of legality written here from the spec, independently of
``protocol._guard``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from salvor.protocol import (
    BUDGET_KINDS,
    EMPTY_VIEW,
    BudgetExceeded,
    Envelope,
    Event,
    GuardRefusal,
    ModelCallCompleted,
    ModelCallRequested,
    NowObserved,
    RandomObserved,
    Resumed,
    RunAbandoned,
    RunCompleted,
    RunFailed,
    RunStarted,
    SleepCompleted,
    SleepStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    check_batch,
    check_next,
    fold,
    step,
)

from .logs import AGENT, OTHER_RUN, RUN, WAKE_AT, recorded_at

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# --------------------------------------------------------------------------
# The reference model: the status table and the resume/resolve/abandon rules,
# restated as plain predicates.


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


@dataclass(frozen=True)
class GateSchema:
    schema: dict
    usable: bool
    accepts: Callable[[Any], bool]


GATE_SCHEMAS = [
    GateSchema(
        {
            "type": "object",
            "required": ["approved"],
            "properties": {"approved": {"type": "boolean"}},
        },
        True,
        lambda v: isinstance(v, dict) and type(v.get("approved", None)) is bool,
    ),
    # required/properties without a type ask for an object.
    GateSchema({"required": ["approved"]}, True, lambda v: isinstance(v, dict) and "approved" in v),
    GateSchema(
        {"properties": {"note": {"type": "string"}}},
        True,
        lambda v: isinstance(v, dict) and isinstance(v.get("note", ""), str),
    ),
    GateSchema({}, True, lambda v: True),
    GateSchema({"type": "number"}, True, _is_number),
    GateSchema({"type": "nonsense"}, False, lambda v: False),
    GateSchema({"type": "string", "pattern": "("}, False, lambda v: False),
]

RESUME_INPUTS = [
    None, 0, 7, -1, 2.5, "yes", True, [], {},
    {"approved": True}, {"approved": "yes"}, {"note": "hi"}, {"note": 3},
    {"extend_by": 5}, {"extend_by": 0}, {"extend_by": -1}, {"extend_by": 2.5},
    {"extend_by": True}, {"extend_by": "5"}, {"extend_by": 1, "more": 1},
]  # fmt: skip


def extension_ok(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"extend_by"}
        and _is_number(value["extend_by"])
        and value["extend_by"] > 0
    )


LABELS = [
    None,
    {},
    {"env": "prod"},
    {f"k{i}": "v" for i in range(16)},
    {f"k{i}": "v" for i in range(17)},
    {"k" * 64: "v" * 256},
    {"k" * 65: "v"},
    {"é" * 33: "v"},
    {"k": "v" * 257},
    {"": "v"},
]


def labels_ok(labels: dict | None) -> bool:
    if labels is None:
        return True
    return len(labels) <= 16 and all(
        1 <= len(k.encode()) <= 64 and len(v.encode()) <= 256 for k, v in labels.items()
    )


class Reference:
    """Legality of the next envelope, from the spec. ``phase`` is the run's state."""

    def __init__(self) -> None:
        self.next_seq = 0
        self.run_id: str | None = None
        self.phase = "not_started"
        self.intent: tuple[str, int, str | None] | None = None  # (kind, seq, tool)
        self.gate: GateSchema | None = None

    def legal(self, env: Envelope, gate: GateSchema | None) -> bool:
        if env.seq != self.next_seq or env.schema_version != 1:
            return False
        if self.run_id is not None and env.run_id != self.run_id:
            return False
        e = env.event
        phase = self.phase
        abandon_plain = isinstance(e, RunAbandoned) and e.unresolved_write is None
        if phase == "not_started":
            return isinstance(e, RunStarted) and labels_ok(e.labels)
        if phase in ("completed", "failed", "abandoned"):
            return False
        if phase == "running":
            if isinstance(e, Suspended):
                return gate is not None and gate.usable
            return abandon_plain or isinstance(
                e,
                (
                    ModelCallRequested,
                    ToolCallRequested,
                    NowObserved,
                    RandomObserved,
                    SleepStarted,
                    BudgetExceeded,
                    RunCompleted,
                    RunFailed,
                ),
            )
        if phase in ("awaiting_model", "awaiting_tool", "needs_reconciliation"):
            kind, seq, tool = self.intent
            completion = ModelCallCompleted if kind == "model" else ToolCallCompleted
            if isinstance(e, completion):
                return e.seq == seq
            if phase == "needs_reconciliation":
                # A write that may have landed: resolve it, or abandon naming it.
                return isinstance(e, RunAbandoned) and e.unresolved_write == {
                    "seq": seq,
                    "tool": tool,
                }
            return abandon_plain or isinstance(e, RunFailed)
        if phase == "suspended":
            return abandon_plain or (isinstance(e, Resumed) and self.gate.accepts(e.input))
        if phase == "budget_exceeded":
            return abandon_plain or (isinstance(e, Resumed) and extension_ok(e.input))
        if phase == "sleeping":
            return abandon_plain or isinstance(e, (NowObserved, SleepCompleted))
        raise AssertionError(phase)

    def apply(self, env: Envelope, gate: GateSchema | None) -> None:
        self.next_seq += 1
        self.run_id = env.run_id
        e = env.event
        if isinstance(e, RunStarted):
            self.phase = "running"
        elif isinstance(e, ModelCallRequested):
            self.phase, self.intent = "awaiting_model", ("model", env.seq, None)
        elif isinstance(e, ToolCallRequested):
            self.phase = "needs_reconciliation" if e.effect == "write" else "awaiting_tool"
            self.intent = ("tool", env.seq, e.tool)
        elif isinstance(e, (ModelCallCompleted, ToolCallCompleted, Resumed, SleepCompleted)):
            self.phase, self.intent = "running", None
        elif isinstance(e, Suspended):
            self.phase, self.gate = "suspended", gate
        elif isinstance(e, SleepStarted):
            self.phase = "sleeping"
        elif isinstance(e, BudgetExceeded):
            self.phase = "budget_exceeded"
        elif isinstance(e, RunCompleted):
            self.phase = "completed"
        elif isinstance(e, RunFailed):
            self.phase = "failed"
        elif isinstance(e, RunAbandoned):
            self.phase = "abandoned"


# --------------------------------------------------------------------------
# Drawing the next envelope, biased towards the run's current position so
# that long legal runs are explored, not just seq mismatches.

KINDS = [
    "RunStarted", "ModelCallRequested", "ModelCallCompleted", "ToolCallRequested",
    "ToolCallCompleted", "NowObserved", "RandomObserved", "Suspended", "Resumed",
    "SleepStarted", "SleepCompleted", "BudgetExceeded", "RunCompleted", "RunFailed",
    "RunAbandoned",
]  # fmt: skip
USAGE = {"input_tokens": 10, "output_tokens": 5}
INTENT_NEXT = [
    "ModelCallCompleted", "ToolCallCompleted", "RunFailed", "RunAbandoned", "Resumed",
] * 2  # fmt: skip
# Kinds worth offering in each phase: the legal ones and their near misses.
# Half of all offers come from here, so long runs reach every state.
LIKELY = {
    "not_started": ["RunStarted", "ModelCallRequested"],
    "running": [
        "ModelCallRequested", "ToolCallRequested", "ToolCallRequested", "Suspended",
        "SleepStarted", "BudgetExceeded", "NowObserved", "RunAbandoned", "Resumed",
        "SleepCompleted", "ModelCallCompleted",
    ],
    "awaiting_model": [*INTENT_NEXT, "ModelCallRequested", "ToolCallRequested"],
    "awaiting_tool": [*INTENT_NEXT, "ToolCallRequested"],
    "needs_reconciliation": [*INTENT_NEXT, "RunAbandoned", "ToolCallRequested"],
    "suspended": ["Resumed", "Resumed", "RunAbandoned", "RunFailed", "BudgetExceeded"],
    "budget_exceeded": ["Resumed", "Resumed", "RunAbandoned", "RunFailed", "SleepCompleted"],
    "sleeping": ["SleepCompleted", "NowObserved", "RunAbandoned", "Resumed", "ModelCallRequested"],
    "completed": KINDS,
    "failed": KINDS,
    "abandoned": KINDS,
}  # fmt: skip


def _usually(draw, likely: Any, other: st.SearchStrategy) -> Any:
    return likely if draw(st.integers(0, 9)) else draw(other)


def draw_next(draw, ref: Reference) -> tuple[Envelope, GateSchema | None]:
    intent_seq = ref.intent[1] if ref.intent else max(ref.next_seq - 1, 0)
    intent_tool = ref.intent[2] if ref.intent and ref.intent[2] else "charge"
    some_seq = st.integers(0, ref.next_seq + 2)
    kind = draw(st.sampled_from(LIKELY[ref.phase]) | st.sampled_from(KINDS))
    gate = None
    if kind == "RunStarted":
        event: Event = RunStarted(
            agent_def_hash=AGENT,
            input=None,
            labels=draw(st.sampled_from(LABELS)),
            driven_by=draw(st.sampled_from([None, "client"])),
        )
    elif kind == "ModelCallRequested":
        event = ModelCallRequested(
            request_hash="sha256:r", performed_by=draw(st.sampled_from([None, "client"]))
        )
    elif kind == "ModelCallCompleted":
        event = ModelCallCompleted(
            seq=_usually(draw, intent_seq, some_seq), response=None, usage=USAGE
        )
    elif kind == "ToolCallRequested":
        event = ToolCallRequested(
            tool=draw(st.sampled_from(["lookup", "charge"])),
            input=None,
            effect=draw(st.sampled_from(["read", "idempotent", "write", "write"])),
            idempotency_key=None,
        )
    elif kind == "ToolCallCompleted":
        event = ToolCallCompleted(
            seq=_usually(draw, intent_seq, some_seq),
            output=None,
            settled_by=draw(st.sampled_from([None, "operator"])),
        )
    elif kind == "NowObserved":
        event = NowObserved(now=WAKE_AT)
    elif kind == "RandomObserved":
        event = RandomObserved(value="4")
    elif kind == "Suspended":
        gate = draw(st.sampled_from(GATE_SCHEMAS))
        event = Suspended(
            reason="r", input_schema=gate.schema, kind=draw(st.sampled_from([None, "signal"]))
        )
    elif kind == "Resumed":
        event = Resumed(input=draw(st.sampled_from(RESUME_INPUTS)))
    elif kind == "SleepStarted":
        event = SleepStarted(wake_at=WAKE_AT)
    elif kind == "SleepCompleted":
        event = SleepCompleted()
    elif kind == "BudgetExceeded":
        event = BudgetExceeded(
            budget={"kind": draw(st.sampled_from(BUDGET_KINDS)), "limit": 3}, observed=3
        )
    elif kind == "RunCompleted":
        event = RunCompleted(output=None)
    elif kind == "RunFailed":
        event = RunFailed(error="x")
    else:
        unresolved = draw(
            st.sampled_from(
                [
                    None,
                    None,
                    {"seq": intent_seq, "tool": intent_tool},
                    {"seq": intent_seq, "tool": "other"},
                ]
            )
        )
        event = RunAbandoned(reason=draw(st.sampled_from([None, "x"])), unresolved_write=unresolved)
    return (
        Envelope(
            run_id=_usually(draw, RUN, st.just(OTHER_RUN)),
            seq=_usually(draw, ref.next_seq, some_seq),
            schema_version=_usually(draw, 1, st.sampled_from([0, 2])),
            recorded_at=recorded_at(ref.next_seq),
            event=event,
        ),
        gate,
    )


@st.composite
def guarded_walks(draw) -> tuple[list[tuple[Envelope, bool]], list[Envelope]]:
    """Offer random envelopes to the guard; keep what it accepts.

    Returns every offer with the reference's verdict, and the accepted log.
    """
    ref = Reference()
    view = EMPTY_VIEW
    offers: list[tuple[Envelope, bool, bool]] = []
    log: list[Envelope] = []
    for _ in range(draw(st.integers(1, 40))):
        env, gate = draw_next(draw, ref)
        legal = ref.legal(env, gate)
        try:
            check_next(view, env)
            accepted = True
        except GuardRefusal:
            accepted = False
        offers.append((env, legal, accepted))
        if legal and accepted:
            ref.apply(env, gate)
            view = step(view, env)
            log.append(env)
            assert view.state.value == ref.phase
    return offers, log


@PROPERTY
@given(guarded_walks())
def test_guard_accepts_exactly_what_the_reference_says_is_legal(walk) -> None:
    offers, _ = walk
    for env, legal, accepted in offers:
        assert accepted == legal, (
            env,
            "reference says legal" if legal else "reference says illegal",
        )


@PROPERTY
@given(guarded_walks())
def test_a_guarded_log_revalidates_and_folds_like_its_steps(walk) -> None:
    _, log = walk
    stepped = functools.reduce(step, log, EMPTY_VIEW)
    assert check_batch(EMPTY_VIEW, log) == stepped
    assert fold(log) == stepped
    assert [env.seq for env in log] == list(range(len(log)))


# --------------------------------------------------------------------------
# The fold is total: any sequence of well-typed envelopes folds.

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
names = st.text(min_size=1, max_size=5)
seqs = st.integers(0, 30)
numbers = st.integers(0, 10**6) | st.floats(0, 1e6)
instants = st.sampled_from([WAKE_AT, "2026-01-01T00:00:00.000000Z", "2030-06-01T12:00:00+02:00"])
optional = st.none
usages = st.fixed_dictionaries(
    {"input_tokens": st.integers(0, 10**6), "output_tokens": st.integers(0, 10**6)}
)
schemas = st.sampled_from([g.schema for g in GATE_SCHEMAS])

any_event = st.one_of(
    st.builds(
        RunStarted,
        agent_def_hash=names,
        input=json_values,
        labels=optional() | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=3),
        driven_by=st.sampled_from([None, "client"]),
    ),
    st.builds(
        ModelCallRequested,
        request_hash=names,
        request_body=json_values,
        performed_by=st.sampled_from([None, "client"]),
    ),
    st.builds(ModelCallCompleted, seq=seqs, response=json_values, usage=usages),
    st.builds(
        ToolCallRequested,
        tool=names,
        input=json_values,
        effect=st.sampled_from(["read", "idempotent", "write"]),
        idempotency_key=optional() | names,
        performed_by=st.sampled_from([None, "client"]),
    ),
    st.builds(
        ToolCallCompleted,
        seq=seqs,
        output=json_values,
        settled_by=st.sampled_from([None, "operator"]),
        deduplicated_from=optional() | st.fixed_dictionaries({"run_id": names, "seq": seqs}),
    ),
    st.builds(NowObserved, now=instants),
    st.builds(RandomObserved, value=names),
    st.builds(
        Suspended, reason=names, input_schema=schemas, kind=st.sampled_from([None, "signal"])
    ),
    st.builds(Resumed, input=json_values | st.sampled_from(RESUME_INPUTS)),
    st.builds(SleepStarted, wake_at=instants),
    st.builds(SleepCompleted),
    st.builds(
        BudgetExceeded,
        budget=st.fixed_dictionaries({"kind": st.sampled_from(BUDGET_KINDS), "limit": numbers}),
        observed=numbers,
    ),
    st.builds(RunCompleted, output=json_values),
    st.builds(RunFailed, error=names),
    st.builds(
        RunAbandoned,
        reason=optional() | st.text(max_size=4),
        unresolved_write=optional() | st.fixed_dictionaries({"seq": seqs, "tool": names}),
    ),
)
any_envelope = st.builds(
    Envelope,
    run_id=st.sampled_from([RUN, OTHER_RUN]),
    seq=seqs,
    schema_version=st.sampled_from([0, 1, 2]),
    recorded_at=st.text(max_size=8),
    event=any_event,
)


@PROPERTY
@given(st.lists(any_envelope, max_size=30))
def test_fold_never_raises(log: list[Envelope]) -> None:
    view = fold(log)
    assert functools.reduce(step, log, EMPTY_VIEW) == view
    assert view.next_seq == (log[-1].seq + 1 if log else 0)
    # Every projection of any view is computable too.
    view.status()
    view.usage()
    view.replay_json()
    view.status_at(datetime(2027, 1, 1, tzinfo=UTC))
    if view.pending is not None:
        view.pending.intent_json()
