"""``/v1/client-runs``: runs whose loop lives in a client while the daemon keeps the log.

The client opens a run and gets a drive token (a lease, see ``_leases``);
it appends the control and context events its own cursor produces through
the guarded append, which re-checks every event against the append guard
before anything is written. Model and tool events never come through the
generic append: they have endpoints of their own, where the daemon decides
effects and keys.

Every refusal records nothing: a batch is validated whole before its first
event is written.
"""

from __future__ import annotations

import json
import uuid

import trio
from quart import request
from quart_trio import QuartTrio
from salvor.protocol import Actor, ErrorCode, sse_frame

from ..client_runs import (
    ModelCall,
    declared,
    model_completion,
    model_intent,
    open_model_step,
    perform_model_step,
    tool_completion,
    tool_intent,
    tool_step,
)
from ..recording import parse_run_id
from ..web import (
    OperationRefused,
    bad_request,
    json_response,
    unknown_run,
    whole_number,
)
from ._answers import CLIENT_LOG, CLIENT_RESOLVED, CLIENT_RUN_OPENED, LEASE_LAPSE, RELEASED
from ._bodies import (
    APPEND_EVENTS,
    CLIENT_MODEL_COMPLETION,
    CLIENT_MODEL_INTENT,
    CLIENT_TOOL_COMPLETION,
    CLIENT_TOOL_INTENT,
    MODEL_STEP,
    OPEN_CLIENT_RUN,
    RESOLVE,
    TOOL_STEP,
)
from ._stream import HEADERS as STREAM_HEADERS

TOKEN_HEADER = "X-Drive-Token"


def step_frame(event: str, data: dict) -> bytes:
    """One frame of a streamed step: a named event carrying JSON."""
    return sse_frame(json.dumps(data, ensure_ascii=False), event=event)


def add_client_run_routes(app: QuartTrio, state) -> None:
    runtime = state.runtime
    leases = state.leases
    appends = state.client_appends
    client_driven = appends.client_driven

    def presented() -> str | None:
        return request.headers.get(TOKEN_HEADER)

    async def driving(run_id: str) -> str:
        """The canonical run id of a driving call, once its run and its drive token check out."""
        return await appends.driving(run_id, presented())

    @app.post("/v1/client-runs")
    async def open_client_run():
        body = await OPEN_CLIENT_RUN.read()
        run_id = body.get("run_id") or str(uuid.uuid4())
        view = await runtime.find_view(run_id)
        if view is not None and view.driven_by != Actor.CLIENT:
            raise OperationRefused(
                ErrorCode.RUN_EXISTS,
                f"run {run_id} already has history as a server-driven run; "
                "a client-driven run needs an id of its own",
            )
        fresh = view is None and not leases.opened(run_id)
        token = leases.open(
            run_id,
            presented(),
            terminal=view is not None and view.terminal,
            record_prompts=body.get("record_prompts", False),
        )
        log = [] if view is None else await runtime.log(run_id)
        return CLIENT_RUN_OPENED.respond(
            201 if fresh else 200, run=run_id, drive_token=token, log=[e.to_json() for e in log]
        )

    @app.post("/v1/client-runs/<run_id>/release")
    async def release(run_id: str):
        run_id = parse_run_id(run_id)
        return RELEASED.respond(released=leases.release(run_id, presented()))

    @app.post("/v1/client-runs/<run_id>/heartbeat")
    async def heartbeat(run_id: str):
        run_id = parse_run_id(run_id)
        if not await client_driven(run_id):
            raise unknown_run(run_id)
        return LEASE_LAPSE.respond(lapses_in_seconds=leases.heartbeat(run_id, presented()))

    @app.get("/v1/client-runs/<run_id>/log")
    async def client_log(run_id: str):
        run_id = parse_run_id(run_id)
        from_seq = whole_number(request.args.get("from_seq", "0"))
        if from_seq is None:
            raise bad_request("`from_seq` must be a whole number (ASCII digits only)")
        if not await client_driven(run_id):
            raise unknown_run(run_id)
        log = await runtime.read_log(run_id, from_seq)
        return CLIENT_LOG.respond(log=[e.to_json() for e in log])

    @app.post("/v1/client-runs/<run_id>/model-step")
    async def model_step_route(run_id: str):
        run_id = await driving(run_id)
        body = await MODEL_STEP.read()
        # Every refusal comes before the stream starts, as the error envelope.
        call = await open_model_step(
            runtime.access,
            run_id,
            body["seq"],
            body["request"],
            record_prompts=leases.record_prompts(run_id),
            executor=state.model_executor,
        )
        if wants_stream():
            return await stream_model_step(run_id, call)
        if call.answer is not None:
            return json_response(call.answer)
        return json_response(
            await perform_model_step(runtime.access, run_id, call, state.model_executor)
        )

    def wants_stream() -> bool:
        return request.args.get("stream") == "1" or "text/event-stream" in request.headers.get(
            "Accept", ""
        )

    async def stream_model_step(run_id: str, call: ModelCall):
        """The step as server-sent events: ``delta`` frames while it runs, then one
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
                        answer = await perform_model_step(
                            runtime.access, run_id, call, state.model_executor, on_delta=delta
                        )
                    except OperationRefused as exc:
                        await frames_out.send(step_frame("error", exc.to_json()["error"]))
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

    @app.post("/v1/client-runs/<run_id>/tool-step")
    async def tool_step_route(run_id: str):
        run_id = await driving(run_id)
        # `effect` is taken for shape parity and ignored: the registration decides it.
        body = await TOOL_STEP.read()
        answer = await tool_step(
            runtime.access,
            runtime.registry,
            run_id,
            body["seq"],
            body["tool"],
            body.get("input"),
            body.get("idempotency_key"),
        )
        return json_response(answer)

    @app.get("/v1/client-tools")
    async def client_tools():
        return json_response(
            {
                "client_tools": [
                    state.client_tools[name].to_json() for name in sorted(state.client_tools)
                ]
            }
        )

    @app.post("/v1/client-runs/<run_id>/client-tool-intent")
    async def client_tool_intent(run_id: str):
        run_id = await driving(run_id)
        body = await CLIENT_TOOL_INTENT.read()
        tool = declared(state.client_tools, body["tool"])
        return json_response(
            await tool_intent(runtime.access, tool, run_id, body["seq"], body.get("input"))
        )

    @app.post("/v1/client-runs/<run_id>/client-tool-completion")
    async def client_tool_completion(run_id: str):
        run_id = await driving(run_id)
        body = await CLIENT_TOOL_COMPLETION.read()
        return json_response(
            await tool_completion(runtime.access, state.client_tools, run_id, body["seq"], body)
        )

    @app.post("/v1/client-runs/<run_id>/client-model-intent")
    async def client_model_intent(run_id: str):
        run_id = await driving(run_id)
        body = await CLIENT_MODEL_INTENT.read()
        return json_response(
            await model_intent(
                runtime.access,
                run_id,
                body["seq"],
                body["request_hash"],
                body.get("request_body"),
                record_prompts=leases.record_prompts(run_id),
            )
        )

    @app.post("/v1/client-runs/<run_id>/client-model-completion")
    async def client_model_completion(run_id: str):
        run_id = await driving(run_id)
        body = await CLIENT_MODEL_COMPLETION.read()
        return json_response(
            await model_completion(
                runtime.access, run_id, body["seq"], body["response"], body["usage"]
            )
        )

    @app.post("/v1/client-runs/<run_id>/resolve")
    async def client_resolve(run_id: str):
        # The driver itself, token in hand: it keeps its lease.
        run_id = await driving(run_id)
        body = await RESOLVE.read()
        await runtime.resolve(run_id, body["output"], state.client_tools)
        return CLIENT_RESOLVED.respond(run=run_id, resolved=True)

    # `salvor serve` answers this route in front of Quart (``_api_front``),
    # through the same two calls; the route keeps it in this app's table, so
    # other methods get their 405 and it answers alike without the front.
    @app.post("/v1/client-runs/<run_id>/events")
    async def append(run_id: str):
        run_id = await driving(run_id)
        return json_response(await appends.append(run_id, await APPEND_EVENTS.read()))
