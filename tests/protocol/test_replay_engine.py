"""The record-and-replay rules, once: the table of cases run against the lane and the cursor.

The proxy's and the MCP lanes' renderings of the same table are in
``tests/daemon/proxies/test_replay_users.py``.
"""

from __future__ import annotations

import pytest
from salvor.protocol import (
    CallNames,
    DivergenceReason,
    Envelope,
    EventKind,
    Mismatch,
    ModelCallCompleted,
    ModelCallRequested,
    RecordedCall,
    ReplayCursor,
    ReplayDivergence,
    ReplayLane,
    Step,
    ToolCallCompleted,
    ToolCallRequested,
    model_mismatch,
    resume_step,
    sha256_hash,
    tool_mismatch,
)

from .logs import started, wrap
from .replay_cases import CASES, ORIGIN, Call, Case, ids, intent_seq

NAMES = CallNames(one="call", many="calls")


def request_hash(call: Call) -> str:
    return sha256_hash({"request": call.request})


def render(calls: tuple[Call, ...]) -> list[Envelope]:
    """A built-in agent's log of ``calls``: model calls by hash, tool calls by name and input."""
    events: list = [started()]
    for call in calls:
        seq = len(events)
        if call.kind == "model":
            events.append(ModelCallRequested(request_hash=request_hash(call)))
            if call.done:
                events.append(
                    ModelCallCompleted(
                        seq=seq,
                        response={"content": []},
                        usage={"input_tokens": 1, "output_tokens": 1},
                    )
                )
        else:
            events.append(
                ToolCallRequested(
                    tool="lookup",
                    input={"q": call.request},
                    effect=call.effect,
                    idempotency_key="idem_1" if call.effect == "idempotent" else None,
                )
            )
            if call.done:
                events.append(ToolCallCompleted(seq=seq, output={"found": call.request}))
    return wrap(events)


def calls_of(log: list[Envelope]) -> list[RecordedCall]:
    completions = {
        env.event.seq: env
        for env in log
        if env.event.KIND in (EventKind.MODEL_CALL_COMPLETED, EventKind.TOOL_CALL_COMPLETED)
    }
    return [
        RecordedCall(env, completions.get(env.seq))
        for env in log
        if env.event.KIND in (EventKind.MODEL_CALL_REQUESTED, EventKind.TOOL_CALL_REQUESTED)
    ]


def match(live: Call):
    def differs(recorded: RecordedCall) -> Mismatch | None:
        event = recorded.intent.event
        if live.kind == "model":
            if not isinstance(event, ModelCallRequested):
                return Mismatch(
                    DivergenceReason.KIND, f"a model call where the log records {event.KIND}"
                )
            return model_mismatch(event, request_hash(live))
        if not isinstance(event, ToolCallRequested):
            return Mismatch(
                DivergenceReason.KIND, f"a tool call where the log records {event.KIND}"
            )
        return tool_mismatch(event, "lookup", {"q": live.request})

    return differs


def lane_for(case: Case) -> ReplayLane[RecordedCall]:
    origin = None if case.origin is None else calls_of(render(case.origin))
    lane = ReplayLane(calls_of(render(case.log)), NAMES, reference=origin, origin=ORIGIN)
    for _ in range(case.answered):
        lane.advance()
    return lane


CALLS = [case for case in CASES if case.live is not None]
ENDS = [case for case in CASES if case.live is None]


@pytest.mark.parametrize("case", CALLS, ids=ids(CALLS))
def test_the_lane_decides_each_call_as_the_table_says(case: Case) -> None:
    lane = lane_for(case)
    open_intent = None if case.open_elsewhere is None else (case.open_elsewhere, "model")
    decision = lane.step(match(case.live), live="asks for it", noun="call", open_intent=open_intent)
    assert decision.step is case.step
    if case.step is Step.DIVERGED:
        divergence = decision.divergence
        expected = {"reason": case.reason.value, "position": case.answered}
        if case.seq is not None:
            expected["seq"] = case.seq
        if case.origin is not None and case.reason is not DivergenceReason.OPEN_ELSEWHERE:
            expected["origin"] = ORIGIN
            expected["recorded"] = len(case.origin)
        else:
            expected["recorded"] = len(case.log)
        assert divergence.details == expected
        assert (divergence.error().code, divergence.error().status) == ("divergence", 409)
        if case.says is not None:
            assert case.says.format(one="call", many="calls") in divergence.message
    else:
        assert decision.divergence is None
        if case.step is Step.REPRODUCE:
            assert decision.call is lane.reference[case.answered]
        elif case.step is not Step.LIVE:
            assert decision.call is lane.calls[case.answered]
    # Deciding never moves the lane: the caller advances once the call is answered.
    assert lane.position == case.answered


@pytest.mark.parametrize("case", ENDS, ids=ids(ENDS))
def test_the_shortfall_names_the_calls_a_drive_never_made_again(case: Case) -> None:
    short = lane_for(case).shortfall("ended")
    if case.says is None:
        assert short is None
    else:
        assert case.says.format(one="call", many="calls") in short.message
        expected = len(case.origin if case.origin is not None else case.log)
        assert (short.made, short.expected) == (case.answered, expected)


def test_a_lane_moves_on_only_when_told_and_matches_its_recorded_calls_in_order() -> None:
    lane = ReplayLane([], NAMES)
    assert lane.step(match(Call("a")), live="asks", noun="call").step is Step.LIVE
    recorded = calls_of(render((Call("a", done=False),)))[0]
    lane.record(recorded)
    # The call failed before its answer: the next call is matched against it again.
    assert lane.step(match(Call("a")), live="asks", noun="call").call is recorded
    lane.advance()
    assert lane.step(match(Call("b")), live="asks", noun="call").step is Step.LIVE
    assert lane.shortfall("ended") is None


CURSOR = [case for case in CALLS if case.origin is None and case.open_elsewhere is None]


@pytest.mark.parametrize("case", CURSOR, ids=ids(CURSOR))
def test_the_cursor_decides_each_call_as_the_table_says(case: Case) -> None:
    log = render(case.log)
    cursor = ReplayCursor(log)
    cursor.position = intent_seq(case.answered) if case.answered < len(case.log) else len(log)
    before = cursor.position
    ask = (
        (lambda: cursor.model_call(request_hash(case.live)))
        if case.live.kind == "model"
        else (lambda: cursor.tool_call("lookup", {"q": case.live.request}))
    )
    if case.step is Step.DIVERGED:
        with pytest.raises(ReplayDivergence) as caught:
            ask()
        assert caught.value.details == {
            "reason": case.reason.value,
            "position": case.seq,
            "seq": case.seq,
        }
        assert caught.value.message.startswith(f"replay diverged at seq {case.seq}: ")
        assert cursor.position == before
        return
    recorded = ask()
    assert resume_step(recorded) is case.step
    if recorded is not None:
        assert recorded.intent is log[before]
