"""The schemas the OpenAPI document defines once, under ``components.schemas``.

What the routes' declarations reference by name: the JSON request bodies (``_bodies``), the
fixed-shape answers (``_answers``, and ``client_runs.CLIENT_RUN_ANSWERS`` for a client-driven run's
steps), the shapes the pure core emits (``protocol.WIRE_SCHEMAS``: status, pending, envelope with
each event kind's payload, replay), a run summary's keys (``store.SUMMARY_KEYS``), and each table of
an agent definition checked against the parser's own field lists (``_agent_schemas``): a mismatch
stops the build. Written here: the error envelope's named variants and the event stream's frames.
Plain data, built at import.
"""

from __future__ import annotations

from salvor.protocol import WIRE_SCHEMAS
from salvor.store import SUMMARY_KEYS, SUMMARY_REQUIRED

from ..client_runs import CLIENT_RUN_ANSWERS
from ._agent_schemas import AGENT_SCHEMAS
from ._answers import ANSWERS, DRIVER, DRIVER_NODE, DRIVER_RULE
from ._bodies import BODIES
from ._fork_schemas import FORK_ANSWERS, FORK_SCHEMAS
from ._graph_schemas import GRAPH_ANSWERS, GRAPH_SCHEMAS
from ._operation import error_schema as _error_schema
from ._schema import INSTANT as _INSTANT
from ._schema import JSON
from ._schema import closed as _object
from ._schema import exactly as _exactly
from ._schema import ref as _ref
from ._session_schemas import SESSION_ANSWERS, SESSION_SCHEMAS
from ._settings_schemas import SETTINGS_ANSWERS, SETTINGS_SCHEMAS

# -- shared shapes ---------------------------------------------------------------------------------


def run_summary(keys: frozenset[str]) -> JSON:
    """A run in a listing: ``RunSummary.to_json()``'s ``keys`` and the ``driver`` beside them.

    Raises:
        RuntimeError: at import, when ``keys`` are not the ones described here.
    """
    return {
        "description": (
            "A run in a listing. Every field but run, event_count and the instants is absent "
            "(never null) when the run's log cannot be read."
        ),
        **_object(
            _exactly(
                "a run summary (RunSummary.to_json() and its driver)",
                keys | {DRIVER.name, DRIVER_NODE.name},
                {
                    "run": _ref("RunId"),
                    "status": _ref("Status"),
                    "event_count": {"type": "integer", "minimum": 0},
                    "first_recorded_at": _ref("Instant"),
                    "last_recorded_at": _ref("Instant"),
                    "usage": _ref("Usage"),
                    "step_count": {"type": "integer", "minimum": 0},
                    "agent_def_hash": _ref("AgentHash"),
                    "graph_hash": {
                        **_ref("GraphHash"),
                        "description": "A graph run's graph (it has no agent_def_hash).",
                    },
                    "labels": {"allOf": [_ref("Labels")], "minProperties": 1},
                    DRIVER.name: DRIVER.described(),
                    DRIVER_NODE.name: DRIVER_NODE.described(),
                },
            ),
            SUMMARY_REQUIRED,
        ),
        **DRIVER_RULE,
    }


SCHEMAS: JSON = {
    "Error": {
        "description": (
            "The one error envelope. `details` is present only with structured evidence."
        ),
        **_object(
            {
                "error": _object(
                    {
                        "code": {"type": "string", "description": "A stable machine token."},
                        "message": {"type": "string", "description": "One human sentence."},
                        "details": {"type": "object"},
                    },
                    ["code", "message"],
                )
            },
            ["error"],
        ),
    },
    "NeedsReconciliationError": _error_schema(
        ["needs_reconciliation"], _object({"intent": _ref("Intent")}, ["intent"])
    ),
    "StillSleepingError": _error_schema(
        ["still_sleeping"],
        _object(
            {"wake_at": _INSTANT, "remaining_seconds": {"type": "integer", "minimum": 0}},
            ["wake_at", "remaining_seconds"],
        ),
    ),
    "AgentHash": {
        "type": "string",
        "pattern": "^sha256:[0-9a-f]{64}$",
        "description": (
            "sha256 over the RFC 8785 canonical JSON of the definition (its `name` excluded)."
        ),
    },
    "GraphHash": {
        "type": "string",
        "pattern": "^sha256:[0-9a-f]{64}$",
        "description": "sha256 over the RFC 8785 canonical JSON of the graph document.",
    },
    # The shapes the pure core emits (status, pending, envelope, ...), from its builders' tables.
    **WIRE_SCHEMAS,
    "RunSummary": run_summary(SUMMARY_KEYS),
    **AGENT_SCHEMAS,
    # The request bodies and the fixed-shape answers: the handlers' own declarations.
    **{body.name: body.schema() for body in BODIES},
    **{answer.name: answer.schema() for answer in ANSWERS},
    **{answer.name: answer.schema() for answer in CLIENT_RUN_ANSWERS},
    # -- graphs (issue 15): the document, its errors, the answers of /v1/graphs* --
    **GRAPH_SCHEMAS,
    **{answer.name: answer.schema() for answer in GRAPH_ANSWERS},
    "InvalidGraphError": _error_schema(
        ["invalid_graph"],
        _object(
            {"errors": {"type": "array", "minItems": 1, "items": _ref("GraphError")}}, ["errors"]
        ),
    ),
    # -- operator settings (issue 16): /v1/settings/edit-mode --
    **SETTINGS_SCHEMAS,
    **{answer.name: answer.schema() for answer in SETTINGS_ANSWERS},
    # -- the page's login (issue 17): /v1/session --
    **SESSION_SCHEMAS,
    **{answer.name: answer.schema() for answer in SESSION_ANSWERS},
    # -- graph runs' projection and forks (issue 15): /v1/runs/{id}/graph, /fork, /forks --
    **FORK_SCHEMAS,
    **{answer.name: answer.schema() for answer in FORK_ANSWERS},
    "WriteReplayHazardError": _error_schema(
        ["write_replay_hazard"],
        _object(
            {
                "writes": {
                    "type": "array",
                    "minItems": 1,
                    "items": _ref("RecordedWrite"),
                    "description": "Exactly the writes still needing acknowledgement.",
                }
            },
            ["writes"],
        ),
    ),
    "OriginNeedsReconciliationError": _error_schema(
        ["origin_needs_reconciliation"], _object({"intent": _ref("Intent")}, ["intent"])
    ),
    "InvalidForkNodeError": _error_schema(
        ["invalid_fork_node"],
        _object(
            {
                "entered": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The nodes the origin did enter, in walk order.",
                }
            },
            ["entered"],
        ),
    ),
    "StreamFrame": {
        "description": (
            "One frame of the event stream as an SSE client reads it (`event` defaults to "
            "`message`; `id` carries over to the frames after it). An event is `id: <seq>` and "
            "`data: <Envelope>` with no `event:` line; the last frame is `event: end` with "
            "`data: <EndFrame>` and no `id:` line of its own."
        ),
        "oneOf": [
            _object(
                {
                    "event": {"const": "message"},
                    "id": {"type": "string", "pattern": "^(0|[1-9][0-9]*)$"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": _ref("Envelope"),
                    },
                },
                ["event", "id", "data"],
            ),
            _object(
                {
                    "event": {"const": "end"},
                    "id": {"type": "string", "pattern": "^(0|[1-9][0-9]*)$"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": _ref("EndFrame"),
                    },
                },
                ["event", "data"],
            ),
        ],
    },
}
