"""A client-driven run's model calls: ``POST /v1/client-runs/{id}/model-step`` (the daemon calls
the model, plain or streamed as server-sent events), and ``client-model-intent`` /
``client-model-completion`` (the client calls it and reports).

Every refusal comes before a stream starts, as the error envelope, and records nothing.
"""

from __future__ import annotations

import json

import trio
from quart import request
from quart_trio import QuartTrio
from salvor.protocol import sse_frame

from ..client_runs import ModelCall
from ..web import HTTP_WORDING, OperationRefused
from ._client_run_bodies import CLIENT_MODEL_COMPLETION, CLIENT_MODEL_INTENT, MODEL_STEP
from ._client_run_routes import presented
from ._http import json_response
from ._operation import DRIVE_FORBIDDEN, DRIVE_MISSING, DRIVEN, Operation, error, route
from ._run_events_routes import HEADERS as STREAM_HEADERS
from ._schema import SEQ, closed, ref
from ._state import ServerState

_TAG = "client-driven runs"

MODEL_STEP_CALL = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/model-step",
    operation_id="clientRunModelStep",
    tag=_TAG,
    summary=(
        "The daemon performs the model call at `seq` (intent first); a retry of a completed step "
        "answers from the log, a dangling one is issued again"
    ),
    parameters=(
        *DRIVEN,
        {
            "name": "stream",
            "in": "query",
            "schema": {"const": "1"},
            "description": "Answer as server-sent events (as `Accept: text/event-stream` does).",
        },
    ),
    body=MODEL_STEP,
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge"),
    responses={
        "200": {
            "description": "The completion (performed now, or recorded before).",
            "content": {
                "application/json": {"schema": ref("ModelStepDone")},
                # Streamed (Accept: text/event-stream, or ?stream=1): delta frames while the call
                # runs, then one complete (or error) frame.
                "text/event-stream": {
                    "schema": {
                        "description": (
                            "One frame as an SSE client reads it: `event:` names it, `data:` is "
                            "its JSON (`x-frame-schemas` by event name); no `id:`."
                        ),
                        **closed(
                            {
                                "event": {"enum": ["delta", "complete", "error"]},
                                "data": {"type": "string", "contentMediaType": "application/json"},
                            },
                            ["event", "data"],
                        ),
                    },
                    "x-frame-schemas": {
                        "delta": closed(
                            {
                                "type": {"enum": ["text_delta", "thinking_delta", "usage"]},
                                "index": SEQ,
                                "text": {"type": "string"},
                                "thinking": {"type": "string"},
                                "usage": {"type": "object"},
                            },
                            ["type"],
                        ),
                        "complete": ref("ModelStepDone"),
                        "error": closed(
                            {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "details": {"type": "object"},
                            },
                            ["code", "message"],
                        ),
                    },
                },
            },
        },
        "401": DRIVE_MISSING,
        "403": DRIVE_FORBIDDEN,
        "409": error("Another event or request at `seq`, or `seq` beyond the log.", "divergence"),
        "502": error(
            "The provider failed; the intent stays open and the same step retries it.",
            "model_execution",
        ),
        "503": error("No model is configured; nothing recorded.", "model_executor_unavailable"),
    },
)
CLIENT_MODEL_INTENT_CALL = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/client-model-intent",
    operation_id="clientModelIntent",
    tag=_TAG,
    summary=(
        "Open a model call the client makes with its own key (the hash is the client's claim)"
    ),
    parameters=DRIVEN,
    body=CLIENT_MODEL_INTENT,
    answers={
        "200": (
            "Open, or already completed (with `response` and `usage`).",
            ref("ClientModelOpened"),
        )
    },
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge"),
    responses={
        "401": DRIVE_MISSING,
        "403": DRIVE_FORBIDDEN,
        "409": error(
            "Another request or a salvor-performed call at `seq`, or `seq` beyond the log.",
            "divergence",
        ),
    },
)
CLIENT_MODEL_COMPLETION_CALL = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/client-model-completion",
    operation_id="clientModelCompletion",
    tag=_TAG,
    summary="Record what the client's own model call returned (usage required)",
    parameters=DRIVEN,
    body=CLIENT_MODEL_COMPLETION,
    answers={"200": ("Recorded.", ref("Completed"))},
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge"),
    responses={
        "401": DRIVE_MISSING,
        "403": error(
            "A bad drive token, or a call salvor performed.",
            "invalid_drive_token",
            "client_completion_refused",
        ),
        "409": error("The log does not end at a model intent at `seq`.", "divergence"),
    },
)
OPERATIONS = (MODEL_STEP_CALL, CLIENT_MODEL_INTENT_CALL, CLIENT_MODEL_COMPLETION_CALL)


def step_frame(event: str, data: dict) -> bytes:
    """One frame of a streamed step: a named event carrying JSON."""
    return sse_frame(json.dumps(data, ensure_ascii=False), event=event)


def wants_stream() -> bool:
    return request.args.get("stream") == "1" or "text/event-stream" in request.headers.get(
        "Accept", ""
    )


def add_model_step_routes(app: QuartTrio, state: ServerState) -> None:
    client_runs = state.client_runs

    @route(app, MODEL_STEP_CALL)
    async def model_step(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        body = await MODEL_STEP.read()
        call = await client_runs.open_model_step(run_id, body["seq"], body["request"])
        if wants_stream():
            return await stream_model_step(app, state, run_id, call)
        return json_response(await client_runs.perform_model_step(run_id, call))

    @route(app, CLIENT_MODEL_INTENT_CALL)
    async def client_model_intent(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        body = await CLIENT_MODEL_INTENT.read()
        return json_response(
            await client_runs.client_model_intent(
                run_id, body["seq"], body["request_hash"], body.get("request_body")
            )
        )

    @route(app, CLIENT_MODEL_COMPLETION_CALL)
    async def client_model_completion(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        body = await CLIENT_MODEL_COMPLETION.read()
        return json_response(
            await client_runs.client_model_completion(
                run_id, body["seq"], body["response"], body["usage"]
            )
        )


async def stream_model_step(app: QuartTrio, state: ServerState, run_id: str, call: ModelCall):
    """The opened step as server-sent events: ``delta`` frames while it runs, then one
    ``complete`` (or ``error``)."""
    frames_out, frames_in = trio.open_memory_channel[bytes](256)
    if call.answer is not None:
        frames_out.send_nowait(step_frame("complete", call.answer))
        frames_out.close()
    else:

        async def perform() -> None:
            async with frames_out:

                async def delta(piece: dict) -> None:
                    await frames_out.send(step_frame("delta", piece))

                try:
                    answer = await state.client_runs.perform_model_step(
                        run_id, call, on_delta=delta
                    )
                except OperationRefused as exc:
                    await frames_out.send(step_frame("error", exc.to_json(HTTP_WORDING)["error"]))
                else:
                    await frames_out.send(step_frame("complete", answer))

        # A watcher that goes away cancels the call: its intent stays open, re-issued on retry.
        scope = state.drivers.spawn(perform, name=f"model step {run_id}@{call.seq}")

    async def frames():
        try:
            async with frames_in:
                async for frame in frames_in:
                    yield frame
        finally:
            if call.answer is None:
                scope.cancel(reason="the client stopped reading the model step's stream")

    response = await app.make_response((frames(), 200, STREAM_HEADERS))
    response.timeout = None
    return response
