"""The JSON request bodies of the control plane, each declared once as a typed ``Body``.

A handler reads its body with ``BODY.read()``: the strict JSON reader first
(``web.json_object``: a JSON content type (else 415), strict JSON, an object, no field outside
the declaration, none of the required ones missing), then each field's own
check, in the order declared, each refusal a 400 ``bad_request`` naming the
field. The OpenAPI document's request schemas are ``BODY.schema()``: the same
fields, the same required set, closed. What a handler accepts and what the
document describes are one declaration, so they cannot drift apart.

A ``check`` is the part of a field's rule the handler needs as code (a
type, a run id put in canonical form); the ``schema`` says the same to a
client. Rules beyond one field are the handler's; ``rules`` states them to
the document. Built at import; reading a body keeps no state.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..client_runs import MODEL_REQUEST_FIELDS
from ..flows import caller_labels
from ..recording import parse_run_id
from ..web import bad_request, object_from
from ._attach_checks import SERVER_NAME, server_names, tool_names, tools_or_servers
from ._http import json_object
from ._schema import ANY, HASH_PATTERN, JSON, SEQ, closed, exactly, nullable, ref

_AGENT_HASH = re.compile(HASH_PATTERN[1:-1])


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    """One field of a body.

    ``check`` takes the value as sent and returns it as the handler uses it,
    or raises ``OperationRefused`` (bad_request); it is skipped for a null
    when the field is ``nullable`` (the handler reads null as left out).
    """

    name: str
    schema: JSON
    required: bool = False
    nullable: bool = False
    check: Callable[[Any], Any] | None = None
    description: str = ""

    def described(self) -> JSON:
        schema = nullable(self.schema) if self.nullable else self.schema
        return {**schema, "description": self.description} if self.description else schema


@dataclass(frozen=True, slots=True)
class Body:
    """A request body: its fields, and what the document calls it.

    ``optional``: an empty body reads as ``{}``. ``precheck`` refuses a body
    whose fields do not go together before any field is checked (``rules``
    says the same in JSON Schema).
    """

    name: str
    fields: tuple[Field, ...]
    description: str = ""
    optional: bool = False
    precheck: Callable[[dict], None] | None = None
    rules: JSON = field(default_factory=dict)
    allowed: frozenset[str] = field(init=False)
    required: frozenset[str] = field(init=False)
    _checked: tuple[Field, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", frozenset(f.name for f in self.fields))
        object.__setattr__(self, "required", frozenset(f.name for f in self.fields if f.required))
        object.__setattr__(self, "_checked", tuple(f for f in self.fields if f.check is not None))

    async def read(self) -> dict:
        """The Quart request's body, checked whole.

        Raises:
            OperationRefused: bad_request (400), unsupported_media_type (415),
                payload_too_large (413) or request_timeout (408); nothing has been recorded.
        """
        body = await json_object(
            allowed=self.allowed, required=self.required, optional_body=self.optional
        )
        return self.checked(body)

    def from_bytes(self, data: bytes, mimetype: str, *, nul: bool = False) -> dict:
        """``read`` on a body already read whole, with its media type.

        The media type is lower case, with no parameters. ``nul`` lets NUL characters through
        (``object_from``): the caller holds the strings that may not carry one to the rule.
        """
        body = object_from(
            data,
            mimetype,
            allowed=self.allowed,
            required=self.required,
            optional_body=self.optional,
            nul=nul,
        )
        return self.checked(body)

    def checked(self, body: dict) -> dict:
        if self.precheck is not None:
            self.precheck(body)
        for spec in self._checked:
            if spec.name in body:
                value = body[spec.name]
                if value is not None or not spec.nullable:
                    body[spec.name] = spec.check(value)
        return body

    def schema(self) -> JSON:
        """The body as a closed JSON Schema object, for ``components.schemas[name]``."""
        described = closed(
            {f.name: f.described() for f in self.fields},
            [f.name for f in self.fields if f.required],
            **self.rules,
        )
        return {"description": self.description, **described} if self.description else described


# -- field checks ----------------------------------------------------------------------------------


def _string(message: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise bad_request(message)
        return value

    return check


def _run_id(message: str) -> Callable[[Any], str]:
    is_string = _string(message)
    return lambda value: parse_run_id(is_string(value))


def _labels(value: Any) -> dict[str, str]:
    # The one label check every door uses (a run started here, a client run's RunStarted, the CLI).
    return caller_labels(value)


def _boolean(message: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise bad_request(message)
        return value

    return check


def _agent_hash(value: Any) -> str:
    if not (isinstance(value, str) and _AGENT_HASH.fullmatch(value)):
        raise bad_request("`agent` must be an agent hash: `sha256:` and 64 lowercase hex digits")
    return value


def _seq(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise bad_request(
            "`seq` must be the non-negative log position the client reserved for the intent"
        )
    return value


def _agent_or_replay(body: dict) -> None:
    if body.get("replay_of") is None and "agent" not in body:
        raise bad_request("the body is missing `agent`")


# -- the bodies ------------------------------------------------------------------------------------

_HASH = {"type": "string", "pattern": HASH_PATTERN}
_STEP_SEQ = Field(name="seq", schema=SEQ, required=True, check=_seq)
_OUTPUT = Field(
    name="output",
    required=True,
    schema={"description": "What the write returned, as the operator established."},
)

START_RUN = Body(
    "StartRun",
    (
        Field(
            name="agent",
            schema=ref("AgentHash"),
            check=_string("`agent` must be an agent hash string"),
        ),
        Field(
            name="replay_of",
            schema=ref("RunId"),
            nullable=True,
            check=_run_id("`replay_of` must be a run id string"),
            description=(
                "Re-run this completed run of an agent process: its input is the origin's, "
                "`agent` defaults to the origin's, and every model call must reproduce the "
                "origin's call at its position, answered from the origin's log with no upstream "
                "call. The re-run fails at the first divergent call."
            ),
        ),
        Field(name="input", schema=ANY),
        Field(name="labels", schema=ref("Labels"), nullable=True, check=_labels),
        Field(
            name="run_id",
            schema=ref("ChosenRunId"),
            nullable=True,
            check=_run_id("`run_id` must be a UUID string"),
        ),
    ),
    precheck=_agent_or_replay,
    rules={
        "anyOf": [
            {"required": ["agent"]},
            {"required": ["replay_of"], "properties": {"replay_of": {"type": "string"}}},
        ],
        # A re-run takes its origin's input.
        "if": {"required": ["replay_of"], "properties": {"replay_of": {"type": "string"}}},
        "then": {"not": {"required": ["input"]}},
    },
)


def _graph_or_flow(body: dict) -> None:
    if sum(field in body for field in ("graph_hash", "flow", "flow_name")) != 1:
        raise bad_request("the body names exactly one of `graph_hash`, `flow_name` and `flow`")
    if "flow" not in body and ("members" in body or "update_baselines" in body):
        raise bad_request("`members` and `update_baselines` go with a `flow`")


def _object(message: str) -> Callable[[Any], dict]:
    def check(value: Any) -> dict:
        if not isinstance(value, dict):
            raise bad_request(message)
        return value

    return check


def _list(message: str) -> Callable[[Any], list]:
    def check(value: Any) -> list:
        if not isinstance(value, list):
            raise bad_request(message)
        return value

    return check


_SPELLING = {
    "type": "object",
    "required": ["state"],
    "properties": {
        "state": {"enum": ["listed", "case_folded", "absent"]},
        "actual": {"type": "string"},
        "addressable": {"type": "boolean"},
    },
    "description": "How the client's directory lists the file's name.",
}
_BASE64 = {"type": "string", "contentEncoding": "base64"}
# A file's bytes by upload (``POST /v1/uploads``) instead of inline: the id, the archive's hash.
_UPLOADED = {
    "upload_id": {
        "type": "string",
        "description": "An upload holding the file's bytes, instead of `content`; spent by this "
        "call whether it starts a run or is refused.",
    },
    "content_hash": {
        "type": "string",
        "description": "The SHA-256 (hex) of that upload's archive, as its upload answered.",
    },
}
_FLOW_FILE = {
    "type": "object",
    "required": ["path", "canonical"],
    "oneOf": [{"required": ["content"]}, {"required": ["upload_id", "content_hash", "size"]}],
    "properties": {
        "path": {"type": "string", "description": "The flow file's path on the client."},
        "canonical": {
            "type": "string",
            "description": "Its real path on the client; what it names resolves beside it.",
        },
        "spelling": _SPELLING,
        "content": {**_BASE64, "description": "The flow file's bytes."},
        **_UPLOADED,
        "size": {"type": "integer", "minimum": 0},
    },
}
_FLOW_MEMBER = {
    "type": "object",
    "required": ["role", "key", "path"],
    "properties": {
        "role": {
            "type": "string",
            "description": "flow, agent, prompt or baseline; a member of another role is skipped.",
        },
        "key": {
            "type": "string",
            "description": "The real directory of the file naming it, a NUL, and the target as "
            "written (a baseline's: its path). A later member with the same key is skipped.",
        },
        "path": {"type": "string"},
        "canonical": {"type": "string", "description": "Its real path on the client."},
        "spelling": _SPELLING,
        "content": {**_BASE64, "description": "Its bytes, when the client sent them."},
        **_UPLOADED,
        "size": {"type": "integer", "minimum": 0, "description": "Its file's bytes."},
        "state": {"enum": ["missing", "refused", "listed"]},
        "error": {"type": "string", "description": "Why the client refused it."},
    },
}
START_GRAPH_RUN = Body(
    "StartGraphRun",
    (
        Field(
            name="graph_hash",
            schema=ref("GraphHash"),
            check=_string("`graph_hash` must be a graph hash string"),
            description="A stored graph to run (or send a `flow_name` or a `flow` instead).",
        ),
        Field(
            name="flow_name",
            schema=ref("FlowName"),
            check=_string("`flow_name` must be a flow's `namespace/name`"),
            description="A flow kept by name: the run walks the graph of its current version "
            "as the call finds it (a later version never changes a run started), and is "
            "labelled `salvor.flow` with the name.",
        ),
        Field(
            name="flow",
            schema=_FLOW_FILE,
            check=_object("`flow` must be an object"),
            description=(
                "A flow file sent over a link, run with its `members` (the files it reaches) "
                "and never opened on this machine: every member is checked before the document, "
                "then the whole flow is pre-checked before its first node."
            ),
        ),
        Field(
            name="members",
            schema={"type": "array", "items": _FLOW_MEMBER},
            check=_list("`members` must be a list"),
        ),
        Field(
            name="update_baselines",
            schema={"type": "boolean"},
            check=_boolean("`update_baselines` must be a boolean"),
            description="Snapshots capture their values, and pinned agent nodes their calls, as "
            "new baselines instead of comparing.",
        ),
        Field(name="input", schema=ANY, description="The run's input; null when left out."),
        Field(name="labels", schema=ref("Labels"), nullable=True, check=_labels),
    ),
    precheck=_graph_or_flow,
    rules={
        "oneOf": [{"required": ["graph_hash"]}, {"required": ["flow_name"]}, {"required": ["flow"]}]
    },
)
RESUME = Body(
    "ResumeInput",
    (
        Field(
            name="input",
            schema={
                "description": "The input a suspended run waits for, or "
                '`{"extend_by": N}` for a budget. Ignored otherwise.'
            },
        ),
    ),
    optional=True,
)
RESOLVE = Body("ResolveOutput", (_OUTPUT,))


def _output_or_not_landed(body: dict) -> None:
    if "not_landed" in body:
        body["not_landed"] = _boolean("`not_landed` must be true or false")(body["not_landed"])
    if ("output" in body) == (body.get("not_landed") is True):
        raise bad_request(
            "give exactly one of `output` (what the write returned) and `not_landed: true` "
            "(it did not happen)"
        )


# The operator's resolve: what the write returned, or that it did not land.
RESOLVE_RUN = Body(
    "ResolveRun",
    (
        Field(name="output", schema=_OUTPUT.schema),
        Field(
            name="not_landed",
            schema={"type": "boolean"},
            description=(
                "true: a person checked that the write did not happen. It is recorded as a "
                "failed call (error kind `not_landed`), the model is told, and its idempotency "
                "identity is given up, so the next call with it performs the write afresh "
                "under the same key."
            ),
        ),
    ),
    precheck=_output_or_not_landed,
    rules={
        "oneOf": [
            {
                "required": ["output"],
                "not": {"required": ["not_landed"], "properties": {"not_landed": {"const": True}}},
            },
            {
                "required": ["not_landed"],
                "properties": {"not_landed": {"const": True}},
                "not": {"required": ["output"]},
            },
        ]
    },
)
ABANDON = Body(
    "AbandonReason",
    (Field(name="reason", schema={"type": "string"}, check=_string("`reason` must be a string")),),
    optional=True,
)


ATTACH_TOOLS = Body(
    "AttachTools",
    (
        Field(
            name="tools",
            schema={"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
            check=tool_names,
            description="Registry tools, by name, to offer the run and the children it starts.",
        ),
        Field(
            name="mcp_servers",
            schema={
                "type": "array",
                "items": {"type": "string", "pattern": SERVER_NAME},
                "minItems": 1,
            },
            check=server_names,
            description="MCP servers the operator declared with --attachable-mcp, by name.",
        ),
    ),
    precheck=tools_or_servers,
    rules={"anyOf": [{"required": ["tools"]}, {"required": ["mcp_servers"]}]},
)

OPEN_CLIENT_RUN = Body(
    "OpenClientRun",
    (
        Field(
            name="record_prompts",
            check=_boolean("`record_prompts` must be true or false"),
            schema={"type": "boolean", "description": "Kept for the server-performed model step."},
        ),
        Field(name="agent", schema=ref("AgentHash"), check=_agent_hash),
        Field(name="input", schema=ANY),
        Field(
            name="run_id",
            schema=ref("ChosenRunId"),
            nullable=True,
            check=_run_id("`run_id` must be a UUID string"),
        ),
    ),
    optional=True,
)
APPEND_EVENTS = Body(
    "AppendEvents",
    (
        Field(
            name="events",
            required=True,
            schema={
                "type": "array",
                "items": ref("Envelope"),
                "minItems": 1,
                "maxItems": 1024,
                "description": (
                    "Envelopes at consecutive seqs; `recorded_at` is overwritten by the server."
                ),
            },
        ),
    ),
)
MODEL_STEP = Body(
    "ModelStep",
    (
        _STEP_SEQ,
        # Checked whole by ``client_runs.open_model_step``, whose fields these are.
        Field(
            name="request",
            required=True,
            schema=closed(
                exactly(
                    "a model step's request",
                    MODEL_REQUEST_FIELDS,
                    {
                        "model": {"type": "string", "minLength": 1},
                        "max_tokens": {"type": "integer", "minimum": 1},
                        "messages": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["role", "content"],
                                "properties": {
                                    "role": {"enum": ["user", "assistant"]},
                                    "content": {"type": ["string", "array"]},
                                },
                            },
                        },
                        "system": {"type": ["string", "array"]},
                        "tools": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}},
                            },
                        },
                    },
                ),
                ["model", "max_tokens", "messages"],
            ),
        ),
    ),
)
TOOL_STEP = Body(
    "ToolStep",
    (
        _STEP_SEQ,
        Field(name="tool", required=True, schema={"type": "string", "minLength": 1}),
        Field(name="input", schema=ANY),
        Field(name="idempotency_key", schema={"type": ["string", "null"], "minLength": 1}),
        # Taken for shape parity and ignored: the registration decides it.
        Field(
            name="effect",
            schema={"description": "Accepted and ignored: the registration decides the effect."},
        ),
    ),
)
CLIENT_TOOL_INTENT = Body(
    "ClientToolIntent",
    (
        _STEP_SEQ,
        Field(name="tool", required=True, schema={"type": "string"}),
        Field(name="input", schema=ANY),
    ),
)
CLIENT_TOOL_COMPLETION = Body(
    "ClientToolCompletion",
    (
        _STEP_SEQ,
        Field(name="output", schema=ANY),
        Field(
            name="error",
            schema=closed(
                {
                    "message": {"type": "string"},
                    "kind": {"enum": ["invalid_input", "handler", "output_serialization"]},
                },
                ["message"],
            ),
        ),
    ),
)
CLIENT_MODEL_INTENT = Body(
    "ClientModelIntent",
    (
        _STEP_SEQ,
        Field(name="request_hash", required=True, schema=_HASH),
        Field(name="request_body", schema=ANY),
    ),
)
CLIENT_MODEL_COMPLETION = Body(
    "ClientModelCompletion",
    (
        _STEP_SEQ,
        Field(name="response", required=True, schema=ANY),
        Field(name="usage", required=True, schema=ref("Usage")),
    ),
)

BODIES = (
    START_RUN,
    START_GRAPH_RUN,
    RESUME,
    RESOLVE,
    RESOLVE_RUN,
    ABANDON,
    ATTACH_TOOLS,
    OPEN_CLIENT_RUN,
    APPEND_EVENTS,
    MODEL_STEP,
    TOOL_STEP,
    CLIENT_TOOL_INTENT,
    CLIENT_TOOL_COMPLETION,
    CLIENT_MODEL_INTENT,
    CLIENT_MODEL_COMPLETION,
)
