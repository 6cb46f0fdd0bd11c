"""A client-driven run's tool calls: ``POST /v1/client-runs/{id}/tool-step`` (a registry tool the
daemon performs), the client tools the operator declared (``GET /v1/client-tools``), and
``client-tool-intent`` / ``client-tool-completion`` (a declared tool the client performs)."""

from __future__ import annotations

from quart_trio import QuartTrio

from ._answers import CLIENT_TOOLS
from ._client_run_bodies import CLIENT_TOOL_COMPLETION, CLIENT_TOOL_INTENT, TOOL_STEP
from ._client_run_routes import presented
from ._http import json_response
from ._operation import DRIVE_FORBIDDEN, DRIVE_MISSING, DRIVEN, Operation, error, route
from ._schema import ref
from ._state import ServerState

_TAG = "client-driven runs"

TOOL_STEP_CALL = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/tool-step",
    operation_id="clientRunToolStep",
    tag=_TAG,
    summary=(
        "The daemon performs the registry tool call at `seq` with the registered effect; retries "
        "follow the effect table"
    ),
    parameters=DRIVEN,
    body=TOOL_STEP,
    answers={
        "200": ("The tool's output (performed now, or recorded before).", ref("ToolStepDone"))
    },
    refusals=("BadRequest", "PayloadTooLarge"),
    responses={
        "401": DRIVE_MISSING,
        "403": DRIVE_FORBIDDEN,
        "404": error("No such client-driven run, or no such tool.", "unknown_run", "unknown_tool"),
        "409": error(
            "Another call at `seq`, or a dangling write (`details.intent`).",
            "divergence",
            "needs_reconciliation",
        ),
        "502": error("Every attempt failed; the intent stays open.", "tool_execution"),
        "503": error(
            "This daemon's host wired no tool registry; nothing recorded.",
            "tool_registry_unavailable",
        ),
    },
)
CLIENT_TOOLS_LIST = Operation(
    method="get",
    rule="/v1/client-tools",
    operation_id="listClientTools",
    tag=_TAG,
    summary="The client-performed tools the operator declared (salvor serve --client-tool)",
    answers={"200": ("The declarations; absent fields are omitted.", CLIENT_TOOLS)},
)
CLIENT_TOOL_INTENT_CALL = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/client-tool-intent",
    operation_id="clientToolIntent",
    tag=_TAG,
    summary=(
        "Open a call the client performs itself: recorded write-ahead, its key derived by the "
        "daemon"
    ),
    parameters=DRIVEN,
    body=CLIENT_TOOL_INTENT,
    answers={
        "200": (
            "Open (`settled` false) or already completed (`settled` true, with `output`).",
            ref("ClientToolOpened"),
        )
    },
    refusals=("BadRequest", "PayloadTooLarge"),
    responses={
        "401": DRIVE_MISSING,
        "403": DRIVE_FORBIDDEN,
        "404": error(
            "No such client-driven run, or no such declared tool.", "unknown_run", "unknown_tool"
        ),
        "409": error(
            "Another event at `seq`, `seq` beyond the log, or the declared key held by an open "
            "call.",
            "divergence",
        ),
    },
)
CLIENT_TOOL_COMPLETION_CALL = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/client-tool-completion",
    operation_id="clientToolCompletion",
    tag=_TAG,
    summary=(
        "Record what the client's own call returned, or how it failed, once the declaration "
        "allows and accepts it"
    ),
    parameters=DRIVEN,
    body=CLIENT_TOOL_COMPLETION,
    answers={"200": ("Recorded.", ref("Completed"))},
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge"),
    responses={
        "401": DRIVE_MISSING,
        "403": error(
            "A bad drive token, or a completion the declaration does not let the client record.",
            "invalid_drive_token",
            "client_completion_refused",
        ),
        "409": error("The log does not end at a tool intent at `seq`.", "divergence"),
    },
)
OPERATIONS = (
    TOOL_STEP_CALL,
    CLIENT_TOOLS_LIST,
    CLIENT_TOOL_INTENT_CALL,
    CLIENT_TOOL_COMPLETION_CALL,
)


def add_tool_step_routes(app: QuartTrio, state: ServerState) -> None:
    client_runs = state.client_runs

    @route(app, TOOL_STEP_CALL)
    async def tool_step(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        # `effect` is taken for shape parity and ignored: the registration decides it.
        body = await TOOL_STEP.read()
        return json_response(
            await client_runs.tool_step(
                run_id, body["seq"], body["tool"], body.get("input"), body.get("idempotency_key")
            )
        )

    @route(app, CLIENT_TOOLS_LIST)
    async def client_tools():
        return CLIENT_TOOLS.respond(client_tools=client_runs.declared_tools())

    @route(app, CLIENT_TOOL_INTENT_CALL)
    async def client_tool_intent(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        body = await CLIENT_TOOL_INTENT.read()
        return json_response(
            await client_runs.client_tool_intent(
                run_id, body["seq"], body["tool"], body.get("input")
            )
        )

    @route(app, CLIENT_TOOL_COMPLETION_CALL)
    async def client_tool_completion(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        body = await CLIENT_TOOL_COMPLETION.read()
        return json_response(await client_runs.client_tool_completion(run_id, body["seq"], body))
