"""The schemas of what the core emits are built from the tables its builders read, and a builder
that drifts from its schema stops the import.

* Every ``RunState`` has one ``Status`` variant, made from ``STATUS_DETAIL`` (the payload of the
  event that enters the state), and the status every case of the view table folds to is admitted
  by that variant and by no other.
* Every envelope of the view table's logs is admitted by ``Envelope`` (each kind its own payload),
  every pending object by ``Pending`` and every intent by ``Intent``.
* A payload schema that names other fields than its event class, or a fixed-key builder (usage,
  replay, envelope, the overdue fields) that writes another key than its schema, raises.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from salvor.protocol import (
    PAYLOADS,
    PENDING_FIELDS,
    STATUS_DETAIL,
    WIRE_SCHEMAS,
    Envelope,
    EventKind,
    RunFailed,
    RunState,
    RunView,
    fold,
)
from salvor.protocol import _wire_schemas as wire

from .logs import VIEW_CASES, ViewCase, wrap

RUN_ID = "5d7c1f8e-0b7a-4c55-9a51-3f0f2b6c9e10"
_BASE = "urn:salvor:wire"
_REGISTRY = Registry().with_resource(
    _BASE,
    Resource.from_contents(
        {"components": {"schemas": dict(WIRE_SCHEMAS)}}, default_specification=DRAFT202012
    ),
)


def _validator(schema: dict) -> Draft202012Validator:
    return Draft202012Validator(
        schema, registry=_REGISTRY, format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def _component(name: str) -> Draft202012Validator:
    return _validator({"$ref": f"{_BASE}#/components/schemas/{name}"})


def _variants() -> dict[str, dict]:
    return {
        variant["properties"]["state"]["const"]: variant
        for variant in WIRE_SCHEMAS["Status"]["oneOf"]
    }


def _admitting(status: dict) -> list[str]:
    """The states whose variant admits ``status`` (refs resolved against the wire schemas)."""
    return [
        state
        for index, state in enumerate(_variants())
        if _validator({"$ref": f"{_BASE}#/components/schemas/Status/oneOf/{index}"}).is_valid(
            status
        )
    ]


cases = pytest.mark.parametrize("case", VIEW_CASES, ids=lambda case: case.name)


def test_every_run_state_has_the_variant_its_table_entry_makes() -> None:
    variants = _variants()
    assert list(variants) == [state.value for state in RunState]
    for state in RunState:
        variant = variants[state.value]
        entered_by = STATUS_DETAIL.get(state)
        fields = set(dataclasses.fields(entered_by)) if entered_by else set()
        expected = {"state"} | {f.name for f in fields}
        if state is RunState.SLEEPING:
            expected |= {"overdue", "overdue_seconds"}
        assert set(variant["properties"]) == expected, state
        assert variant["additionalProperties"] is False
        if entered_by is not None:
            properties, required = PAYLOADS[entered_by.KIND.value]
            assert variant["required"] == ["state", *required]
            for name, schema in properties.items():
                assert variant["properties"][name] == schema, (state, name)


@cases
def test_the_status_each_log_folds_to_is_admitted_by_its_own_variant_alone(
    case: ViewCase,
) -> None:
    view = fold(wrap(case.events, run_id=RUN_ID))
    assert _admitting(view.status()) == [view.state.value]
    # The one status seen through a clock: a sleeping run long past its instant.
    late = view.status_at(datetime(2100, 1, 1, tzinfo=UTC))
    assert _admitting(late) == [view.state.value]
    assert _component("Replay").is_valid(view.replay_json())
    if view.pending is not None:
        assert _component("Pending").is_valid(view.pending.to_json())
        assert _component("Intent").is_valid(view.pending.intent_json())
        assert list(view.pending.to_json()) == ["kind", *PENDING_FIELDS[view.pending.kind]]


@cases
def test_every_recorded_envelope_is_admitted_with_its_kinds_payload(case: ViewCase) -> None:
    envelope = _component("Envelope")
    for recorded in wrap(case.events, run_id=RUN_ID):
        body = recorded.to_json()
        errors = list(envelope.iter_errors(body))
        assert not errors, (body, [e.message for e in errors[:3]])


def test_every_event_kind_has_a_payload_schema() -> None:
    assert set(PAYLOADS) == {kind.value for kind in EventKind}
    oneof = WIRE_SCHEMAS["Envelope"]["properties"]["event"]["oneOf"]
    assert [v["properties"]["kind"]["const"] for v in oneof] == [k.value for k in EventKind]


def test_a_payload_schema_naming_other_fields_than_its_event_stops_the_build() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class RunFailedWithCause(RunFailed):
        cause: str = ""

    fields = wire._PAYLOAD_FIELDS[RunFailed]
    assert wire.payload_properties(RunFailed, fields) == ({"error": fields["error"]}, ["error"])
    with pytest.raises(
        RuntimeError, match=r"RunFailed payload with \['error'\].*\['cause', 'error'\]"
    ):
        wire.payload_properties(RunFailedWithCause, fields)
    with pytest.raises(RuntimeError, match="RunFailed payload"):
        wire.payload_properties(RunFailed, {**fields, "reason": {"type": "string"}})


def test_a_fixed_key_builder_that_writes_another_key_stops_the_build(monkeypatch) -> None:
    wire.check_builders()

    replay_json = RunView.replay_json
    monkeypatch.setattr(RunView, "replay_json", lambda view: {**replay_json(view), "labels": None})
    with pytest.raises(RuntimeError, match=r"RunView.replay_json\(\) is built with"):
        wire.check_builders()
    monkeypatch.undo()

    to_json = Envelope.to_json
    monkeypatch.setattr(
        Envelope, "to_json", lambda envelope: {**to_json(envelope), "kind": envelope.kind}
    )
    with pytest.raises(RuntimeError, match=r"Envelope.to_json\(\) is built with"):
        wire.check_builders()
    monkeypatch.undo()

    seen_at = wire.status_seen_at
    monkeypatch.setattr(
        wire, "status_seen_at", lambda status, now: {**seen_at(status, now), "late": True}
    )
    with pytest.raises(RuntimeError, match=r"status_seen_at\(\) is built with"):
        wire.check_builders()
    monkeypatch.undo()

    monkeypatch.setattr(RunView, "usage", lambda view: {"input_tokens": 0, "output": 0})
    with pytest.raises(RuntimeError, match=r"RunView.usage\(\) is built with"):
        wire.check_builders()


@pytest.mark.parametrize(
    ("payload", "admitted"),
    [
        (
            {
                "seq": 3,
                "output": {"refund_id": "rf_1"},
                "settled_by": "probe",
                "probe": {"tool": "lookup_refund", "input": {"invoice_id": "I"}, "answer": {}},
            },
            True,
        ),
        ({"seq": 3, "output": 1, "settled_by": "operator"}, True),
        ({"seq": 3, "output": 1, "settled_by": "client"}, False),
        (
            {
                "seq": 3,
                "output": 1,
                "settled_by": "probe",
                "probe": {"tool": "t", "input": {}, "answer": 1, "verdict": "landed"},
            },
            False,
        ),
        ({"seq": 3, "output": 1, "settled_by": "probe", "probe": {"tool": "", "input": {}}}, False),
    ],
)
def test_a_completion_names_its_probe_as_the_wire_schema_allows(payload, admitted) -> None:
    body = {
        "run_id": RUN_ID,
        "seq": 4,
        "schema_version": 1,
        "recorded_at": "2026-01-01T00:00:00.000000Z",
        "event": {"kind": "ToolCallCompleted", "payload": payload},
    }
    assert _component("Envelope").is_valid(body) is admitted
