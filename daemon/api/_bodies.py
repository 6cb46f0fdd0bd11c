"""The JSON request bodies of the control plane's runs (start, resume, resolve, abandon, attach
tools), and ``BODIES``: every body the OpenAPI document declares, whichever module declares it.

Each is a ``Body`` (``_body``): what a handler accepts and what the document describes are one
declaration.
"""

from __future__ import annotations

from ..web import bad_request
from ._attach_checks import SERVER_NAME, server_names, tool_names, tools_or_servers
from ._body import Body, Field, boolean_check, labels_check, run_id_check, string_check
from ._client_run_bodies import (
    APPEND_EVENTS,
    CLIENT_MODEL_COMPLETION,
    CLIENT_MODEL_INTENT,
    CLIENT_TOOL_COMPLETION,
    CLIENT_TOOL_INTENT,
    MODEL_STEP,
    OPEN_CLIENT_RUN,
    TOOL_STEP,
)
from ._graph_run_body import START_GRAPH_RUN
from ._schema import ANY, ref


def _agent_or_replay(body: dict) -> None:
    if body.get("replay_of") is None and "agent" not in body:
        raise bad_request("the body is missing `agent`")


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
            check=string_check("`agent` must be an agent hash string"),
        ),
        Field(
            name="replay_of",
            schema=ref("RunId"),
            nullable=True,
            check=run_id_check("`replay_of` must be a run id string"),
            description=(
                "Re-run this completed run of an agent process: its input is the origin's, "
                "`agent` defaults to the origin's, and every model call must reproduce the "
                "origin's call at its position, answered from the origin's log with no upstream "
                "call. The re-run fails at the first divergent call."
            ),
        ),
        Field(name="input", schema=ANY),
        Field(name="labels", schema=ref("Labels"), nullable=True, check=labels_check),
        Field(
            name="run_id",
            schema=ref("ChosenRunId"),
            nullable=True,
            check=run_id_check("`run_id` must be a UUID string"),
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
        body["not_landed"] = boolean_check("`not_landed` must be true or false")(body["not_landed"])
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
    (
        Field(
            name="reason",
            schema={"type": "string"},
            check=string_check("`reason` must be a string"),
        ),
    ),
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
