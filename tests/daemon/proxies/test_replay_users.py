"""The table of record-and-replay cases, rendered as the model proxy's and the MCP lanes' own logs.

Each user reads its log into its own recorded calls (``recorded_calls``,
``lane_calls``) and compares requests its own way (``model_match``,
``mismatch``); the steps, the divergence details and the shortfall come from
the one ``ReplayLane``, so they are the table's, as they are for the built-in
loop's cursor (``tests/protocol/test_replay_engine.py``).
"""

from __future__ import annotations

import pytest
from salvor.daemon.proxies._mcp_replay import (
    call_input,
    lane_calls,
    lane_names,
    lane_tool,
    mismatch,
)
from salvor.daemon.proxies._model_proxy import MODEL_CALLS, model_match, recorded_calls
from salvor.daemon.proxies._wire import OPENAI_CHAT, hashed_request
from salvor.protocol import (
    DivergenceReason,
    Envelope,
    ModelCallCompleted,
    ModelCallRequested,
    ReplayLane,
    Step,
    ToolCallCompleted,
    ToolCallRequested,
    sha256_hash,
)

from tests.protocol.logs import started, wrap
from tests.protocol.replay_cases import CASES, ORIGIN, Call, Case

SERVER = "files"


# -- the model proxy: a lane of model calls -----------------------------------


def proxy_request(call: Call) -> dict:
    return hashed_request(
        OPENAI_CHAT, {"model": "m", "messages": [{"role": "user", "content": call.request}]}
    )


def proxy_log(calls: tuple[Call, ...]) -> list[Envelope]:
    events: list = [started()]
    for call in calls:
        seq = len(events)
        asked = proxy_request(call)
        events.append(ModelCallRequested(request_hash=sha256_hash(asked), request_body=asked))
        if call.done:
            body = {"model": "m", "choices": [{"message": {"role": "assistant", "content": "ok"}}]}
            events.append(
                ModelCallCompleted(
                    seq=seq,
                    response={"wire": OPENAI_CHAT, "body": body},
                    usage={"input_tokens": 1, "output_tokens": 1},
                )
            )
    return wrap(events)


def model_calls_only(case: Case) -> bool:
    return all(
        call.kind == "model"
        for call in (*case.log, *(case.origin or ()), *([case.live] if case.live else ()))
    )


# -- an MCP lane: a server's requests, "model" rendered as resources/read ------------


def mcp_request(call: Call) -> tuple[str, dict]:
    if call.kind == "model":
        return "resources/read", {"uri": f"file:///{call.request}"}
    return "tools/call", {"name": "lookup", "arguments": {"q": call.request}}


def mcp_log(calls: tuple[Call, ...]) -> list[Envelope]:
    events: list = [started()]
    for call in calls:
        seq = len(events)
        method, params = mcp_request(call)
        effect = call.effect or "read"
        events.append(
            ToolCallRequested(
                tool=lane_tool(SERVER, method),
                input=call_input(params),
                effect=effect,
                idempotency_key="idem_1" if effect == "idempotent" else None,
            )
        )
        if call.done:
            events.append(ToolCallCompleted(seq=seq, output={"result": {"content": []}}))
    return wrap(events)


def proxy_lane(case: Case) -> tuple[ReplayLane, object]:
    origin = None if case.origin is None else recorded_calls(proxy_log(case.origin))
    lane = ReplayLane(
        recorded_calls(proxy_log(case.log)), MODEL_CALLS, reference=origin, origin=ORIGIN
    )
    differs = None
    if case.live is not None:
        asked = proxy_request(case.live)
        differs = model_match(asked, sha256_hash(asked), False)
    return lane, differs


def mcp_lane(case: Case) -> tuple[ReplayLane, object]:
    origin = None if case.origin is None else lane_calls(mcp_log(case.origin), SERVER)
    lane = ReplayLane(
        lane_calls(mcp_log(case.log), SERVER), lane_names(SERVER), reference=origin, origin=ORIGIN
    )
    if case.live is None:
        return lane, None
    method, params = mcp_request(case.live)

    def differs(call):
        return mismatch(call, method, call_input(params))

    return lane, differs


USERS = {
    "proxy": (proxy_lane, model_calls_only, ("model call", "model calls")),
    "mcp": (
        mcp_lane,
        lambda case: True,
        (f"MCP server {SERVER!r} (lane mcp:{SERVER}/), call", f"calls of MCP server {SERVER!r}"),
    ),
}
RUNS = [(user, case) for user, (_, fits, _) in USERS.items() for case in CASES if fits(case)]


@pytest.mark.parametrize(
    ("user", "case"), RUNS, ids=[f"{user}: {case.name}" for user, case in RUNS]
)
def test_each_user_reaches_the_tables_step(user: str, case: Case) -> None:
    build, _, (one, many) = USERS[user]
    lane, differs = build(case)
    for _ in range(case.answered):
        lane.advance()
    if case.live is None:
        short = lane.shortfall("ended")
        assert (short is None) is (case.says is None)
        if short is not None:
            assert case.says.format(one=one, many=many) in short.message
        return
    open_intent = None if case.open_elsewhere is None else (case.open_elsewhere, "model")
    decision = lane.step(differs, live="asks for it", noun="call", open_intent=open_intent)
    assert decision.step is case.step
    if case.step is Step.DIVERGED:
        details = decision.divergence.details
        assert (details["reason"], details["position"], details.get("seq")) == (
            case.reason.value,
            case.answered,
            case.seq,
        )
        assert ("origin" in details) is (
            case.origin is not None and case.reason is not DivergenceReason.OPEN_ELSEWHERE
        )
        if case.says is not None:
            assert case.says.format(one=one, many=many) in decision.divergence.message


def test_the_proxy_tells_a_call_recorded_as_a_stream_from_one_that_is_not() -> None:
    lane = ReplayLane(recorded_calls(proxy_log((Call("a"),))), MODEL_CALLS)
    asked = proxy_request(Call("a"))
    decision = lane.step(
        model_match(asked, sha256_hash(asked), True), live="asks for it", noun="call"
    )
    assert decision.step is Step.DIVERGED
    assert decision.divergence.reason is DivergenceReason.REQUEST
    assert decision.divergence.message == (
        "model call 1 (recorded at seq 1) differs from the recording: "
        "it was recorded without streaming; "
        "the agent now asks with streaming"
    )
