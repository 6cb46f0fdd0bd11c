"""The bodies of a client-driven run: opening it, appending its events, and the steps a client
asks the daemon to record or perform (a model call, a tool call, their intents and completions).
"""

from __future__ import annotations

import re
from typing import Any

from ..client_runs import MODEL_REQUEST_FIELDS
from ..web import bad_request
from ._body import Body, Field, boolean_check, run_id_check
from ._schema import ANY, HASH_PATTERN, SEQ, closed, exactly, ref

_AGENT_HASH = re.compile(HASH_PATTERN[1:-1])


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


_HASH = {"type": "string", "pattern": HASH_PATTERN}
_STEP_SEQ = Field(name="seq", schema=SEQ, required=True, check=_seq)

OPEN_CLIENT_RUN = Body(
    "OpenClientRun",
    (
        Field(
            name="record_prompts",
            check=boolean_check("`record_prompts` must be true or false"),
            schema={"type": "boolean", "description": "Kept for the server-performed model step."},
        ),
        Field(name="agent", schema=ref("AgentHash"), check=_agent_hash),
        Field(name="input", schema=ANY),
        Field(
            name="run_id",
            schema=ref("ChosenRunId"),
            nullable=True,
            check=run_id_check("`run_id` must be a UUID string"),
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
