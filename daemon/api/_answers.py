"""The fixed-shape JSON answers of the control plane, each declared once as a typed ``Answer``.

A handler answers with ``ANSWER.respond(status, **fields)`` (a stream frame's data with
``ANSWER.body(**fields)``); the OpenAPI document's schema for it is ``ANSWER.schema()``: the same
fields, the same required set, closed. An answer that names a field the declaration lacks, or
leaves out a required one, is a bug: it raises, and the client gets the 500 envelope (the tests
drive every answer, so it never ships). The shapes the pure core emits (a status, a pending call,
an envelope, a replay) are its own (``salvor.protocol.WIRE_SCHEMAS``); a client-driven run's
step answers are ``client_runs``'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from quart import Response
from salvor.protocol import (
    TERMINAL_STATES,
    Envelope,
    RunState,
    Shape,
    encode_envelope,
    nullable,
)

from ..agents import FORMATS, AgentKind
from ._body import Field
from ._http import json_response
from ._schema import JSON, SEQ, closed, ref

_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_TERMINAL = [state.value for state in RunState if state in TERMINAL_STATES]


@dataclass(frozen=True, slots=True)
class Answer:
    """A JSON answer: its fields, and what the document calls it."""

    name: str
    fields: tuple[Field, ...]
    description: str = ""
    rules: JSON = field(default_factory=dict)
    shape: Shape = field(init=False)
    _optional: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "shape",
            Shape(
                self.name,
                {f.name: f.described() for f in self.fields},
                tuple(f.name for f in self.fields if f.required),
                self.description,
                self.rules,
            ),
        )
        object.__setattr__(
            self,
            "_optional",
            frozenset(f.name for f in self.fields if not f.required and not f.nullable),
        )

    def body(self, **values: Any) -> dict:
        """The answer's JSON object; an optional field given as None is left out.

        Raises:
            RuntimeError: a field the declaration lacks, or a required one missing (a bug).
        """
        return self.shape.check(
            {
                name: value
                for name, value in values.items()
                if value is not None or name not in self._optional
            }
        )

    def respond(self, status: int = 200, /, **values: Any) -> Response:
        """The answer as JSON (``body``)."""
        return json_response(self.body(**values), status)

    def respond_with_log(self, status: int, log: Sequence[Envelope], /, **values: Any) -> Response:
        """The answer as compact JSON, its ``log`` field the envelopes in their wire bytes.

        A log is the same bytes wherever it is read (the event stream, these answers,
        ``salvor history --json``), so each envelope is spliced in as ``encode_envelope``
        wrote it rather than encoded a second time.
        """
        fields = self.body(**values, log=[])
        del fields["log"]
        head = _compact(fields)[:-1] + ("," if fields else "")
        text = head + '"log":[' + ",".join(map(encode_envelope, log)) + "]}"
        return Response(text, status=status, content_type="application/json")

    def schema(self) -> JSON:
        return self.shape.schema()


def _required(name: str, schema: JSON, description: str = "") -> Field:
    return Field(name=name, schema=schema, required=True, description=description)


_RUN = _required("run", ref("RunId"))
_STATUS = _required("status", ref("Status"))
_INSTANT = ref("Instant")
_COUNT = {"type": "integer", "minimum": 0}
_PENDING = {"oneOf": [ref("Pending"), {"type": "null"}]}

# Added by ``ServerState.driver`` to a run's answer and to each summary in a listing: present
# exactly when the status is known and not terminal.
DRIVER = Field(
    name="driver",
    schema={"enum": ["attached", "none"]},
    description="Whether a driver is running the run now (a drive on this daemon or on another "
    "node serving the same store, or a client's current lease); absent for a terminal run.",
)
# Issue 30: beside ``driver`` when a node (a ``salvor serve`` over the same store) drives the run.
DRIVER_NODE = Field(
    name="driver_node",
    schema={"type": "string", "minLength": 1},
    description="An extension: the node whose drive holds the run now, this daemon or another "
    "one serving the same store (its id, as `salvor serve` logs it at start); absent when no "
    "node drives it.",
)
DRIVER_RULE: JSON = {
    "if": {
        "required": ["status"],
        "properties": {"status": {"properties": {"state": {"enum": _TERMINAL}}}},
    },
    "then": {"not": {"required": ["driver"]}},
    "else": {
        "if": {"required": ["status"]},
        "then": {"required": ["driver"]},
        "else": {"not": {"required": ["driver"]}},
    },
}

RUN = Answer(
    "Run",
    (
        _RUN,
        _STATUS,
        _required("event_count", _COUNT),
        _required("usage", ref("Usage")),
        _required("pending", _PENDING),
        _required("first_recorded_at", _INSTANT),
        _required("last_recorded_at", _INSTANT),
        DRIVER,
        DRIVER_NODE,
        Field(
            name="replay_of",
            schema=ref("RunId"),
            description="Present on a re-run: the run it reproduces.",
        ),
        Field(
            name="parent",
            schema=ref("RunId"),
            description=(
                "An extension: present on a subagent's child run, the run whose subagent call "
                "started it (its `salvor.parent` label). The parent's children are "
                "`GET /v1/runs/{id}/children`."
            ),
        ),
        # What a listing's entry says of the run, under the same absence rules, so a client
        # holding only the run's id needs no listing to tell an agent run from a graph run.
        Field(
            name="agent_def_hash",
            schema=ref("AgentHash"),
            description="An agent run's agent, as its head recorded it.",
        ),
        Field(
            name="graph_hash",
            schema=ref("GraphHash"),
            description="A graph run's graph (it has no agent_def_hash).",
        ),
        Field(
            name="labels",
            schema={"allOf": [ref("Labels")], "minProperties": 1},
            description="The labels its head recorded; absent when it recorded none.",
        ),
        Field(
            name="driven_by",
            schema={"const": "client"},
            description="Present on a client-driven run (its head says so): the daemon never "
            "drives it, and it cannot be re-run.",
        ),
    ),
    rules=DRIVER_RULE,
)
END_FRAME = Answer(
    "EndFrame",
    (
        _STATUS,
        Field(
            name="detached",
            schema={"const": True},
            description="No driver here is running the run.",
        ),
    ),
    description="The `data` of the stream's final `event: end` frame.",
)
CLIENT_LOG = Answer("ClientLog", (_required("log", {"type": "array", "items": ref("Envelope")}),))
_RUNNING = _required("status", {"const": "running"})

AGENT_CREATED = Answer(
    "AgentCreated",
    (_required("agent", ref("AgentHash")), _required("created", {"type": "boolean"})),
)
RUN_STARTED = Answer("RunStarted", (_RUN, _RUNNING, Field(name="replay_of", schema=ref("RunId"))))
RESUME_DRIVING = Answer(
    "ResumeDriving", (_RUN, _RUNNING, _required("outcome", {"const": "driving"}))
)
RESUME_FINISHED = Answer(
    "ResumeFinished", (_RUN, _required("outcome", {"enum": _TERMINAL}), _STATUS)
)
RESOLVED = Answer("Resolved", (_RUN, _required("resolved", {"const": True}), _STATUS))
ABANDONED = Answer(
    "Abandoned",
    (_RUN, _required("abandoned", {"const": True}), _required("appended_seq", SEQ), _STATUS),
)
_NAMES = {"type": "array", "items": {"type": "string"}}
TOOLS_ATTACHED = Answer(
    "ToolsAttached",
    (
        _RUN,
        _required(
            "tools",
            _NAMES,
            "Every tool attached to the run's tree now, in order (an MCP server as mcp:NAME).",
        ),
        _required(
            "runs",
            {"type": "array", "items": ref("RunId")},
            "The runs of the tree that hold it now.",
        ),
        _required(
            "busy",
            {"type": "array", "items": ref("RunId")},
            "Children a drive held past the wait: they did not record it (attach them again).",
        ),
    ),
)
HEALTH = Answer(
    "Health",
    (
        _required("status", {"const": "ok"}),
        _required(
            "recovering",
            {
                "type": "integer",
                "minimum": 0,
                "description": "Interrupted runs handed to recovery whose drive has not begun yet.",
            },
        ),
        _required(
            "healing",
            {
                "type": "integer",
                "minimum": 0,
                "description": "Runs a store fault stopped, waiting "
                "to be driven again once it takes writes.",
            },
        ),
        Field(
            name="worker",
            schema={
                "type": "integer",
                "minimum": 0,
                "description": "Which worker of `salvor serve --workers N` answered (absent "
                "from a daemon of one process).",
            },
        ),
    ),
)
CAPABILITIES = Answer(
    "Capabilities",
    (
        _required(
            "capabilities",
            {
                "type": "object",
                "additionalProperties": {"type": "boolean"},
                "description": "A capability is listed true only when this server has it.",
            },
        ),
        _required(
            "server",
            closed(
                {
                    "version": {"type": "string"},
                    "commit": {
                        "type": "string",
                        "description": "Short git hash, `-dirty` with local "
                        "changes; absent when unknown.",
                    },
                },
                ["version"],
            ),
        ),
    ),
)
CLIENT_RUN_OPENED = Answer(
    "ClientRunOpened",
    (
        _RUN,
        _required("drive_token", {"type": "string", "pattern": "^dt_"}),
        _required("log", {"type": "array", "items": ref("Envelope")}),
    ),
)
RELEASED = Answer("Released", (_required("released", {"type": "boolean"}),))
LEASE_LAPSE = Answer(
    "LeaseLapse", (_required("lapses_in_seconds", {"type": "integer", "minimum": 1}),)
)
CLIENT_RESOLVED = Answer("ClientResolved", (_RUN, _required("resolved", {"const": True})))

AGENT_SUMMARY = Answer(
    "AgentSummary",
    (
        _required("agent", ref("AgentHash")),
        Field(name="name", schema={"type": "string", "minLength": 1}),
    ),
    description="A registered agent in a listing; `name` only when the definition has one.",
)
AGENT_LIST = Answer(
    "AgentList", (_required("agents", {"type": "array", "items": ref("AgentSummary")}),)
)
AGENT = Answer(
    "Agent",
    (
        _required("agent", ref("AgentHash")),
        _required("format", {"enum": list(FORMATS)}),
        _required(
            "definition", {"type": "string"}, description="The definition as registered, verbatim."
        ),
        Field(name="name", schema={"type": "string", "minLength": 1}),
        Field(
            name="kind",
            schema={"enum": list(AgentKind)},
            description="What drives its runs: salvor's own loop (`builtin`), a local program "
            "(`process`) or a running service (`service`); only these last two can be re-run "
            "(`replay_of`). Absent when the stored definition no longer builds here.",
        ),
    ),
)
RUN_LIST = Answer(
    "RunList",
    (
        _required("runs", {"type": "array", "items": ref("RunSummary")}),
        Field(
            name="next_cursor",
            schema={"type": "string"},
            description="Present when there may be more: pass it as `cursor`.",
        ),
    ),
)
CHILD_LIST = Answer(
    "ChildList",
    (
        _RUN,
        _required(
            "derived",
            {"const": True},
            description="Read from the children's own labels, not from the parent's log.",
        ),
        _required(
            "children",
            {"type": "array", "items": ref("RunSummary")},
            description="The runs its subagent calls started, oldest first.",
        ),
    ),
)
RECONCILIATION = Answer(
    "Reconciliation",
    (
        _RUN,
        _required(
            "agent",
            {"oneOf": [ref("AgentHash"), {"type": "null"}]},
            description="The run's agent, as `GET /v1/runs` names it (`agent_def_hash`).",
        ),
        _required("labels", ref("Labels")),
        _required("parked_since", _INSTANT, description="When the write's intent was recorded."),
        _required(
            "intent",
            ref("Intent"),
            description="The write, as the 409 `needs_reconciliation` refusal's `details.intent`.",
        ),
        _required("idempotency_key", {"type": ["string", "null"]}),
        _required(
            "probe",
            nullable(
                closed(
                    {
                        "tool": {"type": "string", "description": "The read the probe called."},
                        "input": {"description": "What it was called with."},
                        "answer": {"description": "What it answered; null when it gave none."},
                        "error": {
                            "type": ["string", "null"],
                            "description": "Why it gave no answer (it failed or timed out).",
                        },
                        "verdict": {
                            "enum": ["landed", "not_landed", "unknown"],
                            "description": "What the answer said of the write; a parked "
                            "write's last probe could not tell (`unknown`).",
                        },
                        "observed_at": _INSTANT,
                    },
                    ["tool", "input", "answer", "error", "verdict", "observed_at"],
                )
            ),
            description="The last answer of the write's probe; null when its tool declares "
            "none or it has not run.",
        ),
        _required(
            "resolve",
            closed(
                {
                    "path": {"type": "string", "pattern": "^/v1/runs/[^/]+/resolve$"},
                    "performed_by": {
                        "enum": ["salvor", "client"],
                        "description": "Who performed the write: a client's output is checked "
                        "against its declaration here.",
                    },
                    "output_schema": {
                        "oneOf": [{"type": "object"}, {"type": "boolean"}, {"type": "null"}],
                        "description": "The declared output schema of a client's write; null "
                        "when salvor performed it or no declaration is loaded.",
                    },
                    "require_equal": {
                        "type": "object",
                        "description": "Fields the output must hold with these values (the "
                        "recorded input's), for a client's declared write.",
                    },
                },
                ["path", "performed_by", "output_schema", "require_equal"],
            ),
            description="What `POST /v1/runs/{id}/resolve` expects for this write.",
        ),
    ),
    description="A run parked on a write of unknown outcome, and what settles it.",
)
RECONCILIATION_LIST = Answer(
    "ReconciliationList",
    (
        _required("reconciliations", {"type": "array", "items": ref("Reconciliation")}),
        Field(
            name="next_cursor",
            schema={"type": "string"},
            description="Present when there may be more: pass it as `cursor`.",
        ),
    ),
)
CLIENT_TOOLS = Answer(
    "ClientTools", (_required("client_tools", {"type": "array", "items": ref("ClientTool")}),)
)
# ``GET /v1/tools``: the registry's tools a graph's tool nodes may call, and their file inputs.
_FILE_INPUT = closed(
    {
        "target": {"type": "string", "description": "The argument that holds the file's path."},
        "path": {
            "type": "string",
            "description": "How the path is made: always `${<target>}`, the argument alone.",
        },
    },
    ["target", "path"],
)
_TOOL = closed(
    {
        "name": {"type": "string"},
        "effect": {"enum": ["read", "idempotent", "write"]},
        "file_inputs": {
            "type": "array",
            "items": _FILE_INPUT,
            "description": (
                "Arguments whose value is a file the tool reads: in a flow, a literal absolute "
                "`.json`, `.yaml`, `.png` or `.txt` path the client sends with the call."
            ),
        },
    },
    ["name", "effect", "file_inputs"],
)
TOOLS = Answer("Tools", (_required("tools", {"type": "array", "items": _TOOL}),))

ANSWERS = (
    TOOLS,
    RUN,
    RUN_LIST,
    CHILD_LIST,
    RECONCILIATION,
    RECONCILIATION_LIST,
    AGENT_SUMMARY,
    AGENT_LIST,
    AGENT,
    CLIENT_TOOLS,
    END_FRAME,
    CLIENT_LOG,
    AGENT_CREATED,
    RUN_STARTED,
    RESUME_DRIVING,
    RESUME_FINISHED,
    RESOLVED,
    ABANDONED,
    TOOLS_ATTACHED,
    HEALTH,
    CAPABILITIES,
    CLIENT_RUN_OPENED,
    RELEASED,
    LEASE_LAPSE,
    CLIENT_RESOLVED,
)
