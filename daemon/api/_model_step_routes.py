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
from ._bodies import CLIENT_MODEL_COMPLETION, CLIENT_MODEL_INTENT, MODEL_STEP
from ._client_run_routes import presented
from ._http import json_response
from ._run_events_routes import HEADERS as STREAM_HEADERS
from ._state import ServerState


def step_frame(event: str, data: dict) -> bytes:
    """One frame of a streamed step: a named event carrying JSON."""
    return sse_frame(json.dumps(data, ensure_ascii=False), event=event)


def wants_stream() -> bool:
    return request.args.get("stream") == "1" or "text/event-stream" in request.headers.get(
        "Accept", ""
    )


def add_model_step_routes(app: QuartTrio, state: ServerState) -> None:
    client_runs = state.client_runs

    @app.post("/v1/client-runs/<run_id>/model-step")
    async def model_step(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        body = await MODEL_STEP.read()
        call = await client_runs.open_model_step(run_id, body["seq"], body["request"])
        if wants_stream():
            return await stream_model_step(app, state, run_id, call)
        return json_response(await client_runs.perform_model_step(run_id, call))

    @app.post("/v1/client-runs/<run_id>/client-model-intent")
    async def client_model_intent(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        body = await CLIENT_MODEL_INTENT.read()
        return json_response(
            await client_runs.client_model_intent(
                run_id, body["seq"], body["request_hash"], body.get("request_body")
            )
        )

    @app.post("/v1/client-runs/<run_id>/client-model-completion")
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
