"""The envelope codec: pinned bytes, strict payloads, absent-never-null."""

from __future__ import annotations

import json

import pytest
from salvor.protocol import (
    EVENT_TYPES,
    BudgetExceeded,
    Event,
    GraphRunStarted,
    MalformedEvent,
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
    SleepCompleted,
    SleepStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    ToolsAttached,
    decode_envelope,
    decode_event,
    encode_envelope,
    encode_payload,
)

from .logs import AGENT, REQUEST, WAKE_AT, envelope

# Every kind, once with each optional field set and once with none.
SAMPLES: list[tuple[str, Event]] = [
    (
        "RunStarted full",
        RunStarted(
            agent_def_hash=AGENT, input={"claim": "C-7"}, labels={"env": "prod"}, driven_by="client"
        ),
    ),
    ("RunStarted minimal", RunStarted(agent_def_hash=AGENT, input=None)),
    ("RunStarted re-run", RunStarted(agent_def_hash=AGENT, input="task", replay_of="origin-run")),
    (
        "ModelCallRequested full",
        ModelCallRequested(
            request_hash=REQUEST, request_body={"messages": []}, performed_by="client"
        ),
    ),
    ("ModelCallRequested minimal", ModelCallRequested(request_hash=REQUEST)),
    (
        "ModelCallCompleted",
        ModelCallCompleted(
            seq=1, response={"text": "héllo 😀"}, usage={"input_tokens": 3, "output_tokens": 4}
        ),
    ),
    (
        "ToolCallRequested full",
        ToolCallRequested(
            tool="charge",
            input={"amount": 10},
            effect="write",
            idempotency_key="k-1",
            performed_by="client",
        ),
    ),
    (
        "ToolCallRequested minimal",
        ToolCallRequested(tool="lookup", input=None, effect="read", idempotency_key=None),
    ),
    (
        "ToolCallCompleted full",
        ToolCallCompleted(
            seq=3,
            output=[1, 2.5, "x"],
            settled_by="operator",
            deduplicated_from={"run_id": "r0", "seq": 9},
        ),
    ),
    (
        "ToolCallCompleted settled by a probe",
        ToolCallCompleted(
            seq=3,
            output={"refund_id": "rf_1"},
            settled_by="probe",
            probe={"tool": "lookup_refund", "input": {"invoice_id": "I"}, "answer": None},
        ),
    ),
    ("ToolCallCompleted minimal", ToolCallCompleted(seq=3, output=None)),
    ("NowObserved", NowObserved(now="2026-01-01T00:00:00.000000Z")),
    ("RandomObserved", RandomObserved(value="0.25")),
    ("Suspended signal", Suspended(reason="await", input_schema={"type": "object"}, kind="signal")),
    ("Suspended gate", Suspended(reason="approve", input_schema={})),
    ("Resumed", Resumed(input={"approved": True})),
    ("Resumed with null", Resumed(input=None)),
    ("SleepStarted", SleepStarted(wake_at=WAKE_AT)),
    ("SleepCompleted", SleepCompleted()),
    ("BudgetExceeded", BudgetExceeded(budget={"kind": "cost_usd", "limit": 2.5}, observed=2.75)),
    ("RunCompleted", RunCompleted(output={"verdict": "refund"})),
    ("RunFailed", RunFailed(error="provider refused")),
    (
        "RunAbandoned full",
        RunAbandoned(reason="gone", unresolved_write={"seq": 4, "tool": "charge"}),
    ),
    ("RunAbandoned minimal", RunAbandoned()),
    (
        "GraphRunStarted forked",
        GraphRunStarted(
            graph_hash=AGENT,
            input={"topic": "tides"},
            labels={"env": "prod"},
            forked_from={
                "run_id": "origin-run",
                "through_seq": 3,
                "from_node": "publish",
                "graph_hash": AGENT,
                "acknowledged_writes": [4],
            },
        ),
    ),
    ("GraphRunStarted minimal", GraphRunStarted(graph_hash=AGENT, input=None)),
    ("NodeEntered", NodeEntered(node="research", input={"topic": "tides"})),
    ("NodeExited branch", NodeExited(node="route", output=True, branch_case="true")),
    ("NodeExited minimal", NodeExited(node="research", output=None)),
    ("NodeSkipped", NodeSkipped(node="reject", reason="an upstream branch took another case")),
    ("MapItemCompleted", MapItemCompleted(node="each", index=2, run_id="child", output=[1])),
    ("ToolsAttached", ToolsAttached(tools=["lookup_claim"], by="operator")),
    (
        "MapItemCompleted with its child's usage",
        MapItemCompleted(
            node="each",
            index=0,
            run_id="child",
            output=None,
            usage={"input_tokens": 3, "output_tokens": 4},
        ),
    ),
]
samples = pytest.mark.parametrize("event", [e for _, e in SAMPLES], ids=[n for n, _ in SAMPLES])


def test_samples_cover_every_kind() -> None:
    assert {type(event).KIND.value for _, event in SAMPLES} == set(EVENT_TYPES)


@samples
def test_round_trip_is_byte_identical(event: Event) -> None:
    original = envelope(5, event)
    text = encode_envelope(original)
    decoded = decode_envelope(text)
    assert decoded == original
    assert encode_envelope(decoded) == text
    assert decode_envelope(text.encode("utf-8")) == original
    assert decode_envelope(json.loads(text)) == original
    assert decode_event(event.KIND.value, json.loads(encode_payload(event, seq=5)), seq=5) == event


@samples
def test_optional_fields_are_absent_when_unset(event: Event) -> None:
    payload = json.loads(encode_payload(event, seq=5))
    for name in type(event).optional:
        if getattr(event, name) is None:
            assert name not in payload
        else:
            assert payload[name] == getattr(event, name)
    # Payload keys are written in declaration order, an intent's own position first.
    declared = [name for name in type(event)._field_names() if name in payload]
    assert list(payload) == (["seq", *declared] if type(event).positioned else declared)


def test_pinned_wire_bytes() -> None:
    event = ToolCallRequested(
        tool="charge",
        input={"note": "café 😀", "amount": 10},
        effect="write",
        idempotency_key=None,
        performed_by="client",
    )
    assert encode_envelope(envelope(3, event)) == (
        '{"run_id":"run-1","seq":3,"schema_version":1,'
        '"recorded_at":"2026-01-01T00:00:03.000000Z",'
        '"event":{"kind":"ToolCallRequested","payload":{"seq":3,"tool":"charge",'
        '"input":{"note":"café 😀","amount":10},"effect":"write",'
        '"idempotency_key":null,"performed_by":"client"}}}'
    )
    assert encode_envelope(envelope(0, RunStarted(agent_def_hash="sha256:x", input=None))) == (
        '{"run_id":"run-1","seq":0,"schema_version":1,'
        '"recorded_at":"2026-01-01T00:00:00.000000Z",'
        '"event":{"kind":"RunStarted","payload":{"agent_def_hash":"sha256:x","input":null}}}'
    )
    assert encode_payload(Suspended(reason="r", input_schema={}, kind="signal"), seq=2) == (
        '{"reason":"r","input_schema":{},"kind":"signal"}'
    )
    assert encode_payload(SleepCompleted(), seq=4) == "{}"
    assert encode_payload(ModelCallRequested(request_hash="sha256:h"), seq=7) == (
        '{"seq":7,"request_hash":"sha256:h"}'
    )


def test_envelope_to_json_and_kind() -> None:
    wrapped = envelope(1, RunFailed(error="x"))
    assert wrapped.kind == "RunFailed"
    assert list(wrapped.to_json()) == ["run_id", "seq", "schema_version", "recorded_at", "event"]


GOOD = json.loads(encode_envelope(envelope(0, RunStarted(agent_def_hash=AGENT, input=None))))


def _with(path: tuple, value: object) -> dict:
    """GOOD with one key set (or, with value DELETE, removed)."""
    body = json.loads(json.dumps(GOOD))
    target = body
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


DELETE = object()
PAYLOAD = ("event", "payload")

MALFORMED: list[tuple[str, object]] = [
    ("null optional field", _with((*PAYLOAD, "labels"), None)),
    ("null optional driven_by", _with((*PAYLOAD, "driven_by"), None)),
    ("unknown payload field", _with((*PAYLOAD, "colour"), "red")),
    ("missing required field", _with((*PAYLOAD, "agent_def_hash"), DELETE)),
    ("missing required nullable field", _with((*PAYLOAD, "input"), DELETE)),
    ("empty agent_def_hash", _with((*PAYLOAD, "agent_def_hash"), "")),
    ("labels with a number value", _with((*PAYLOAD, "labels"), {"k": 1})),
    ("driven_by not client", _with((*PAYLOAD, "driven_by"), "server")),
    ("null optional replay_of", _with((*PAYLOAD, "replay_of"), None)),
    ("empty replay_of", _with((*PAYLOAD, "replay_of"), "")),
    ("replay_of not a string", _with((*PAYLOAD, "replay_of"), 7)),
    (
        "a client-driven re-run",
        _with(
            (*PAYLOAD,),
            {"agent_def_hash": AGENT, "input": None, "driven_by": "client", "replay_of": "origin"},
        ),
    ),
    ("payload not an object", _with(PAYLOAD, [])),
    ("unknown kind", _with(("event", "kind"), "RunExploded")),
    ("kind not a string", _with(("event", "kind"), 7)),
    ("event with an extra key", _with(("event", "extra"), 1)),
    ("event without payload", _with(PAYLOAD, DELETE)),
    ("event not an object", _with(("event",), "RunStarted")),
    ("wrong schema_version", _with(("schema_version",), 2)),
    ("schema_version a string", _with(("schema_version",), "1")),
    ("seq negative", _with(("seq",), -1)),
    ("seq a float", _with(("seq",), 0.0)),
    ("seq a boolean", _with(("seq",), False)),
    ("run_id empty", _with(("run_id",), "")),
    ("run_id a number", _with(("run_id",), 1)),
    ("recorded_at a number", _with(("recorded_at",), 0)),
    ("extra envelope key", _with(("trace",), "x")),
    ("missing envelope key", _with(("recorded_at",), DELETE)),
    ("a list", [GOOD]),
    ("a string", "RunStarted"),
    ("null", None),
    ("invalid JSON", '{"run_id": '),
    ("not UTF-8", b'{"run_id": "\xff"}'),
    ("JSON array text", "[]"),
    ("NaN in a payload", json.dumps(_with((*PAYLOAD, "input"), "NAN")).replace('"NAN"', "NaN")),
    (
        "Infinity in a payload",
        json.dumps(_with((*PAYLOAD, "input"), "INF")).replace('"INF"', "Infinity"),
    ),
    (
        "a number too large for a double",
        json.dumps(_with((*PAYLOAD, "input"), "BIG")).replace('"BIG"', "1e400"),
    ),
]


@pytest.mark.parametrize("data", [d for _, d in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_malformed_is_refused(data: object) -> None:
    if isinstance(data, dict):
        # The same refusal whether the envelope arrives as text or parsed.
        with pytest.raises(MalformedEvent):
            decode_envelope(json.dumps(data, ensure_ascii=False))
    with pytest.raises(MalformedEvent) as caught:
        decode_envelope(data)  # type: ignore[arg-type]
    assert (caught.value.code, caught.value.status) == ("bad_request", 400)


def test_the_good_envelope_decodes() -> None:
    assert decode_envelope(GOOD).event == RunStarted(agent_def_hash=AGENT, input=None)


ILL_TYPED: list[tuple[str, str, dict]] = [
    (
        "ModelCallCompleted",
        "usage with a missing count",
        {"seq": 1, "response": None, "usage": {"input_tokens": 1}},
    ),
    (
        "ModelCallCompleted",
        "usage with an extra key",
        {"seq": 1, "response": None, "usage": {"input_tokens": 1, "output_tokens": 1, "cache": 1}},
    ),
    (
        "ModelCallCompleted",
        "negative token count",
        {"seq": 1, "response": None, "usage": {"input_tokens": -1, "output_tokens": 1}},
    ),
    (
        "ModelCallCompleted",
        "boolean seq",
        {"seq": True, "response": None, "usage": {"input_tokens": 1, "output_tokens": 1}},
    ),
    (
        "MapItemCompleted",
        "usage with a missing count",
        {"node": "each", "index": 0, "run_id": "c", "output": 1, "usage": {"input_tokens": 1}},
    ),
    ("ModelCallRequested", "performed_by server", {"request_hash": "h", "performed_by": "server"}),
    ("ModelCallRequested", "null request_body", {"request_hash": "h", "request_body": None}),
    (
        "ToolCallRequested",
        "unknown effect",
        {"tool": "t", "input": 1, "effect": "delete", "idempotency_key": None},
    ),
    ("ToolCallRequested", "missing idempotency_key", {"tool": "t", "input": 1, "effect": "read"}),
    (
        "ToolCallRequested",
        "empty idempotency_key",
        {"tool": "t", "input": 1, "effect": "read", "idempotency_key": ""},
    ),
    (
        "ToolCallRequested",
        "empty tool",
        {"tool": "", "input": 1, "effect": "read", "idempotency_key": None},
    ),
    ("ToolCallCompleted", "settled_by client", {"seq": 1, "output": 1, "settled_by": "client"}),
    (
        "ToolCallCompleted",
        "settled_by probe without its probe",
        {"seq": 1, "output": 1, "settled_by": "probe"},
    ),
    (
        "ToolCallCompleted",
        "a probe on an operator's settlement",
        {
            "seq": 1,
            "output": 1,
            "settled_by": "operator",
            "probe": {"tool": "t", "input": {}, "answer": 1},
        },
    ),
    (
        "ToolCallCompleted",
        "a probe missing its answer",
        {"seq": 1, "output": 1, "settled_by": "probe", "probe": {"tool": "t", "input": {}}},
    ),
    (
        "ToolCallCompleted",
        "a probe with an empty tool",
        {
            "seq": 1,
            "output": 1,
            "settled_by": "probe",
            "probe": {"tool": "", "input": {}, "answer": 1},
        },
    ),
    (
        "ToolCallCompleted",
        "deduplicated_from missing seq",
        {"seq": 1, "output": 1, "deduplicated_from": {"run_id": "r"}},
    ),
    ("NowObserved", "not an instant", {"now": "yesterday"}),
    ("NowObserved", "no offset", {"now": "2026-01-01T00:00:00"}),
    ("SleepStarted", "a date only", {"wake_at": "2026-01-01"}),
    ("RandomObserved", "empty value", {"value": ""}),
    ("Suspended", "schema not an object", {"reason": "r", "input_schema": True}),
    ("Suspended", "kind human", {"reason": "r", "input_schema": {}, "kind": "human"}),
    ("Suspended", "null kind", {"reason": "r", "input_schema": {}, "kind": None}),
    ("SleepCompleted", "any field", {"at": WAKE_AT}),
    (
        "BudgetExceeded",
        "unknown budget kind",
        {"budget": {"kind": "calls", "limit": 1}, "observed": 1},
    ),
    ("BudgetExceeded", "negative limit", {"budget": {"kind": "steps", "limit": -1}, "observed": 1}),
    (
        "BudgetExceeded",
        "boolean observed",
        {"budget": {"kind": "steps", "limit": 1}, "observed": True},
    ),
    ("RunFailed", "empty error", {"error": ""}),
    ("RunAbandoned", "null reason", {"reason": None}),
    (
        "RunAbandoned",
        "unresolved_write with an extra key",
        {"unresolved_write": {"seq": 1, "tool": "t", "x": 1}},
    ),
    (
        "RunAbandoned",
        "unresolved_write with a string seq",
        {"unresolved_write": {"seq": "1", "tool": "t"}},
    ),
]


@pytest.mark.parametrize(
    ("kind", "payload"),
    [(k, p) for k, _, p in ILL_TYPED],
    ids=[f"{k}: {n}" for k, n, _ in ILL_TYPED],
)
def test_ill_typed_payload_is_refused(kind: str, payload: dict) -> None:
    with pytest.raises(MalformedEvent) as caught:
        decode_event(kind, payload, seq=0)
    assert kind in caught.value.message


def test_an_ill_typed_event_cannot_be_built() -> None:
    with pytest.raises(MalformedEvent):
        ToolCallRequested(tool="t", input=1, effect="delete", idempotency_key=None)
    with pytest.raises(TypeError):
        RunFailed("positional")  # type: ignore[misc]


# The control-plane spec writes an intent as `{ seq, ... }`: the payload names its own position.
POSITIONED = [
    ("ModelCallRequested", {"request_hash": REQUEST}),
    ("ToolCallRequested", {"tool": "t", "input": 1, "effect": "read", "idempotency_key": None}),
]


@pytest.mark.parametrize(("kind", "fields"), POSITIONED, ids=[k for k, _ in POSITIONED])
def test_an_intent_payload_names_its_position(kind: str, fields: dict) -> None:
    event = decode_event(kind, {"seq": 4, **fields}, seq=4)
    assert encode_payload(event, seq=4) == json.dumps({"seq": 4, **fields}, separators=(",", ":"))
    assert envelope(4, event).to_json()["event"]["payload"] == {"seq": 4, **fields}


@pytest.mark.parametrize(("kind", "fields"), POSITIONED, ids=[k for k, _ in POSITIONED])
def test_an_intent_payload_from_before_the_position_rule_still_reads(
    kind: str, fields: dict
) -> None:
    # Stores written before intents carried `seq` must still load; re-encoded, they gain it.
    event = decode_event(kind, dict(fields), seq=4)
    assert decode_event(kind, {"seq": 4, **fields}, seq=4) == event


@pytest.mark.parametrize(
    ("kind", "fields", "seq", "message"),
    [
        (kind, fields, seq, message)
        for kind, fields in POSITIONED
        for seq, message in [
            (3, "payload `seq` 3 is not the event's position 4"),
            (-1, "`seq` must be a non-negative integer"),
            (True, "`seq` must be a non-negative integer"),
            ("4", "`seq` must be a non-negative integer"),
        ]
    ],
)
def test_an_intent_payload_at_another_position_is_malformed(
    kind: str, fields: dict, seq, message: str
) -> None:
    with pytest.raises(MalformedEvent) as caught:
        decode_event(kind, {"seq": seq, **fields}, seq=4)
    assert caught.value.message == f"{kind}: {message}"
    wire = envelope(4, decode_event(kind, dict(fields), seq=4)).to_json()
    wire["event"]["payload"]["seq"] = seq
    with pytest.raises(MalformedEvent):
        decode_envelope(wire)


@pytest.mark.parametrize("kind", sorted(set(EVENT_TYPES) - {k for k, _ in POSITIONED}))
def test_no_other_kind_carries_its_own_position(kind: str) -> None:
    assert not EVENT_TYPES[kind].positioned
