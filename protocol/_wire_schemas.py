"""The JSON Schemas of what the core puts on the wire, built from the tables its builders read.

An event's payload is described field by field against the event class's own fields
(``exactly``); the status object of each ``RunState`` is ``STATUS_DETAIL``'s event payload; the
pending object is ``PENDING_FIELDS`` of the intents' payloads. The fixed-key builders (usage, the
replay projection, the envelope, the overdue fields) are run once on a sample here and their keys
compared with what is described. Any disagreement raises ``RuntimeError`` when ``salvor.protocol``
is imported, so it cannot reach a served document; the hot paths themselves check nothing.

``WIRE_SCHEMAS`` holds the components the OpenAPI document takes as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType

from ._envelope import _ENVELOPE_KEYS, _EVENT_KEYS, Envelope
from ._event_checks import USAGE_KEYS
from ._event_codec import Event
from ._event_kinds import BUDGET_KINDS, Actor, Effect
from ._events import (
    EVENT_TYPES,
    FORK_ORIGIN_KEYS,
    BudgetExceeded,
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
    SleepCompleted,
    SleepStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    ToolsAttached,
)
from ._fold import (
    EMPTY_VIEW,
    INTENT_FIELDS,
    PENDING_FIELDS,
    STATUS_DETAIL,
    PendingKind,
    RunState,
    status_seen_at,
)
from ._labels import MAX_LABEL_KEY_BYTES, MAX_LABEL_VALUE_BYTES, MAX_LABELS
from ._shapes import ANY, HASH_PATTERN, INSTANT, JSON, SEQ, closed, exactly, ref

_TEXT: JSON = {"type": "string", "minLength": 1}
_MOMENT: JSON = {"type": "string", "format": "date-time"}
_COUNT: JSON = {"type": "integer", "minimum": 0}
_AMOUNT: JSON = {"type": "number", "minimum": 0}


# A pinned agent node's call, answered from its baseline file (this path) instead of made.
_ANSWERED_FROM: JSON = {
    **_TEXT,
    "description": "Answered from a pinned agent node's baseline at this path; nothing was sent "
    "or performed.",
}


def _by(*actors: Actor) -> JSON:
    if len(actors) == 1:
        return {"const": actors[0].value, "description": "Absent when the daemon did it."}
    return {"enum": [a.value for a in actors], "description": "Absent when the daemon did it."}


# Each event's payload fields, as the event class declares them (``exactly`` holds the two equal).
_PAYLOAD_FIELDS: Mapping[type[Event], JSON] = {
    RunStarted: {
        "agent_def_hash": _TEXT,
        "input": ANY,
        "labels": ref("Labels"),
        "driven_by": _by(Actor.CLIENT),
        "replay_of": {**_TEXT, "description": "A re-run: the run whose log it reproduces."},
    },
    ModelCallRequested: {
        "request_hash": {"type": "string", "pattern": HASH_PATTERN},
        "request_body": {**ANY, "description": "Recorded only when the run records prompts."},
        "performed_by": _by(Actor.CLIENT),
    },
    ModelCallCompleted: {
        "seq": SEQ,
        "response": ANY,
        "usage": ref("Usage"),
        "baseline": _ANSWERED_FROM,
    },
    ToolCallRequested: {
        "tool": _TEXT,
        "input": ANY,
        "effect": {"enum": [effect.value for effect in Effect]},
        "idempotency_key": {"type": ["string", "null"], "minLength": 1},
        "performed_by": _by(Actor.CLIENT),
    },
    ToolCallCompleted: {
        "seq": SEQ,
        "output": ANY,
        "settled_by": _by(Actor.OPERATOR, Actor.PROBE),
        "deduplicated_from": closed(
            {"run_id": _TEXT, "seq": SEQ},
            ["run_id", "seq"],
            description="The call whose completion this one copies (same declared key).",
        ),
        "probe": closed(
            {"tool": _TEXT, "input": ANY, "answer": ANY},
            ["tool", "input", "answer"],
            description=(
                'With settled_by "probe": the read that found the write landed, and its answer.'
            ),
        ),
        "baseline": _ANSWERED_FROM,
    },
    NowObserved: {"now": _MOMENT},
    RandomObserved: {"value": _TEXT},
    Suspended: {
        "reason": _TEXT,
        "input_schema": {
            "type": "object",
            "description": "The JSON Schema a resume input must satisfy.",
        },
        "kind": {
            "const": "signal",
            "description": "Present only when an external system, not a person, owes the input.",
        },
    },
    Resumed: {"input": ANY},
    SleepStarted: {"wake_at": _MOMENT},
    SleepCompleted: {},
    BudgetExceeded: {
        "budget": closed(
            {"kind": {"enum": list(BUDGET_KINDS)}, "limit": _AMOUNT}, ["kind", "limit"]
        ),
        "observed": _AMOUNT,
    },
    RunCompleted: {"output": ANY},
    RunFailed: {"error": _TEXT},
    RunAbandoned: {
        "reason": {"type": "string"},
        "unresolved_write": closed(
            {"seq": SEQ, "tool": _TEXT},
            ["seq", "tool"],
            description="The dangling write the run was abandoned with.",
        ),
    },
    GraphRunStarted: {
        "graph_hash": {"type": "string", "pattern": HASH_PATTERN},
        "input": ANY,
        "labels": ref("Labels"),
        "forked_from": ref("ForkOrigin"),
        "flow": {
            "type": "string",
            "pattern": HASH_PATTERN,
            "description": "A run of a flow file: the manifest of its files, kept with the run.",
        },
    },
    NodeEntered: {"node": _TEXT, "input": {**ANY, "description": "The node's resolved input."}},
    NodeExited: {
        "node": _TEXT,
        "output": ANY,
        "branch_case": {**_TEXT, "description": "A branch node only: the case it took."},
    },
    NodeSkipped: {"node": _TEXT, "reason": _TEXT},
    MapItemCompleted: {
        "node": _TEXT,
        "index": _COUNT,
        "run_id": {**_TEXT, "description": "The child run that performed the item."},
        "output": ANY,
        "usage": {
            **ref("Usage"),
            "description": "An agent item's: its child's model calls, counted into this run's.",
        },
    },
    ToolsAttached: {
        "tools": {
            "type": "array",
            "items": _TEXT,
            "minItems": 1,
            "description": (
                "The registry tools attached, by name; an MCP server the operator declared as "
                "attachable is mcp:NAME."
            ),
        },
        "by": {
            "enum": ["operator", "agent"],
            "description": "Who attached them: the operator's API call, or an agent's attach_tool.",
        },
    },
}

# A fork's head names where it was cut from (``GraphRunStarted.forked_from``).
FORK_ORIGIN = closed(
    exactly(
        "a fork origin",
        FORK_ORIGIN_KEYS,
        {
            "run_id": _TEXT,
            "through_seq": SEQ,
            "from_node": _TEXT,
            "graph_hash": {"type": "string", "pattern": HASH_PATTERN},
            "acknowledged_writes": {"type": "array", "items": SEQ},
        },
    ),
    sorted(FORK_ORIGIN_KEYS),
    description="The origin run, the last origin seq the fork's prefix copies, the node it "
    "re-walks from, the graph both walk, and the origin writes the operator let re-fire.",
)


def payload_properties(event_type: type[Event], fields: JSON) -> tuple[JSON, list[str]]:
    """(properties, required) of ``event_type``'s payload as ``payload_at`` writes it.

    Raises:
        RuntimeError: ``fields`` does not name exactly the event class's fields.
    """
    names = event_type._field_names()
    properties = exactly(f"the {event_type.KIND.value} payload", names, fields)
    required = [name for name in names if name not in event_type.optional]
    if event_type.positioned:
        return {"seq": SEQ, **properties}, ["seq", *required]
    return dict(properties), required


def _payloads() -> dict[str, tuple[JSON, list[str]]]:
    missing = sorted(set(EVENT_TYPES) - {cls.KIND.value for cls in _PAYLOAD_FIELDS})
    if missing:
        raise RuntimeError(f"no payload schema for the event kinds {missing}")
    return {cls.KIND.value: payload_properties(cls, f) for cls, f in _PAYLOAD_FIELDS.items()}


PAYLOADS = _payloads()


def _status_variant(state: RunState) -> JSON:
    properties: JSON = {"state": {"const": state.value}}
    required = ["state"]
    entered_by = STATUS_DETAIL.get(state)
    if entered_by is not None:
        detail, detail_required = PAYLOADS[entered_by.KIND.value]
        properties.update(detail)
        required += detail_required
    if state is RunState.SLEEPING:
        properties.update(_OVERDUE)
        return closed(
            properties,
            required,
            dependentRequired={"overdue": ["overdue_seconds"], "overdue_seconds": ["overdue"]},
        )
    return closed(properties, required)


# What ``status_seen_at`` adds to a sleeping run's status once its instant has passed.
_OVERDUE: JSON = {"overdue": {"const": True}, "overdue_seconds": _COUNT}


def _pending_variant(kind: PendingKind, *more: str) -> JSON:
    intent = PAYLOADS[
        (ModelCallRequested if kind is PendingKind.MODEL else ToolCallRequested).KIND.value
    ][0]
    extra = {"recorded_at": INSTANT}
    properties: JSON = {"kind": {"const": kind.value}}
    for name in (*PENDING_FIELDS[kind], *more):
        if name not in intent and name not in extra:
            raise RuntimeError(f"the {kind.value} pending object's `{name}` has no schema")
        properties[name] = extra.get(name) or intent[name]
    return closed(properties, list(properties))


def _tied(what: str, built: dict, described: JSON) -> None:
    """A sample of a fixed-key builder's output against the properties its schema describes.

    Raises:
        RuntimeError: the builder writes other keys than the schema describes.
    """
    if set(built) != set(described):
        raise RuntimeError(
            f"{what} is built with {sorted(built)}, but its schema describes {sorted(described)}"
        )


USAGE = closed(
    exactly(
        "usage",
        USAGE_KEYS,
        {"input_tokens": _COUNT, "output_tokens": _COUNT},
    ),
    ["input_tokens", "output_tokens"],
)
REPLAY = closed(
    {
        "status": ref("Status"),
        "usage": ref("Usage"),
        "next_seq": SEQ,
        "pending": {"oneOf": [ref("Pending"), {"type": "null"}]},
    },
    ["status", "usage", "next_seq", "pending"],
)
ENVELOPE = closed(
    exactly(
        "an envelope",
        _ENVELOPE_KEYS,
        {
            "run_id": ref("RunId"),
            "seq": SEQ,
            "schema_version": {"type": "integer", "minimum": 1},
            "recorded_at": INSTANT,
            "event": {
                "description": "`{kind, payload}`: the payload is the kind's own.",
                "oneOf": [
                    closed(
                        exactly(
                            "an envelope's event",
                            _EVENT_KEYS,
                            {"kind": {"const": kind}, "payload": closed(*PAYLOADS[kind])},
                        ),
                        ["kind", "payload"],
                    )
                    for kind in EVENT_TYPES
                ],
            },
        },
    ),
    ["run_id", "seq", "schema_version", "recorded_at", "event"],
    description="One recorded event: the `data` of a stream frame, byte for byte what "
    "`salvor history --json` prints.",
)


def check_builders() -> None:
    """Run each fixed-key builder once on a sample and compare its keys with its schema.

    Raises:
        RuntimeError: naming the builder and both key sets.
    """
    _tied("RunView.usage()", EMPTY_VIEW.usage(), USAGE["properties"])
    _tied("RunView.replay_json()", EMPTY_VIEW.replay_json(), REPLAY["properties"])
    sample = Envelope(
        run_id="r", seq=0, schema_version=1, recorded_at="", event=SleepCompleted()
    ).to_json()
    _tied("Envelope.to_json()", sample, ENVELOPE["properties"])
    event = ENVELOPE["properties"]["event"]["oneOf"][0]["properties"]
    _tied("Envelope.to_json()['event']", sample["event"], event)
    asleep = {"state": RunState.SLEEPING.value, "wake_at": "2000-01-01T00:00:00Z"}
    late = status_seen_at(asleep, datetime(2001, 1, 1, tzinfo=UTC))
    _tied("status_seen_at()", late, {**asleep, **_OVERDUE})


check_builders()

WIRE_SCHEMAS: Mapping[str, JSON] = MappingProxyType(
    {
        "RunId": {"type": "string", "format": "uuid"},
        # An id a caller chooses for a new run: any UUID but a name-based one (version 3 or 5),
        # the kind salvor derives for the runs it starts itself.
        "ChosenRunId": {
            "type": "string",
            "format": "uuid",
            "not": {"pattern": "^(urn:uuid:)?[{]?[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[35]"},
            "description": "A UUID of any version but 3 and 5 (name-based: salvor derives those "
            "for the runs it starts itself); a name-based one is a 400.",
        },
        "Instant": INSTANT,
        "Usage": USAGE,
        "Labels": {
            "type": "object",
            "maxProperties": MAX_LABELS,
            # UTF-8 byte counts are beyond JSON Schema: the formats name them
            # (tests/daemon/api/test_fuzz.py gives schemathesis a strategy for each).
            "propertyNames": {"format": "salvor-label-key"},
            "additionalProperties": {"type": "string", "format": "salvor-label-value"},
            "description": f"At most {MAX_LABELS}; keys 1 to {MAX_LABEL_KEY_BYTES} bytes of "
            f"UTF-8, values at most {MAX_LABEL_VALUE_BYTES} bytes.",
        },
        "Status": {
            "description": "`{state, ...that state's fields}`.",
            "oneOf": [_status_variant(state) for state in RunState],
        },
        "Pending": {
            "description": "The run's one open intent.",
            "oneOf": [_pending_variant(kind) for kind in PendingKind],
        },
        "Intent": {
            "description": "The pending object plus when its intent was recorded.",
            "oneOf": [_pending_variant(kind, *INTENT_FIELDS) for kind in PendingKind],
        },
        "Replay": REPLAY,
        "ForkOrigin": FORK_ORIGIN,
        "Envelope": ENVELOPE,
    }
)
