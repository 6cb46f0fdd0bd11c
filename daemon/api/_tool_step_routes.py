"""A client-driven run's tool calls: ``POST /v1/client-runs/{id}/tool-step`` (a registry tool the
daemon performs), the client tools the operator declared (``GET /v1/client-tools``), and
``client-tool-intent`` / ``client-tool-completion`` (a declared tool the client performs)."""

from __future__ import annotations

from quart_trio import QuartTrio

from ._answers import CLIENT_TOOLS
from ._bodies import CLIENT_TOOL_COMPLETION, CLIENT_TOOL_INTENT, TOOL_STEP
from ._client_run_routes import presented
from ._http import json_response
from ._state import ServerState


def add_tool_step_routes(app: QuartTrio, state: ServerState) -> None:
    client_runs = state.client_runs

    @app.post("/v1/client-runs/<run_id>/tool-step")
    async def tool_step(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        # `effect` is taken for shape parity and ignored: the registration decides it.
        body = await TOOL_STEP.read()
        return json_response(
            await client_runs.tool_step(
                run_id, body["seq"], body["tool"], body.get("input"), body.get("idempotency_key")
            )
        )

    @app.get("/v1/client-tools")
    async def client_tools():
        return CLIENT_TOOLS.respond(client_tools=client_runs.declared_tools())

    @app.post("/v1/client-runs/<run_id>/client-tool-intent")
    async def client_tool_intent(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        body = await CLIENT_TOOL_INTENT.read()
        return json_response(
            await client_runs.client_tool_intent(
                run_id, body["seq"], body["tool"], body.get("input")
            )
        )

    @app.post("/v1/client-runs/<run_id>/client-tool-completion")
    async def client_tool_completion(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        body = await CLIENT_TOOL_COMPLETION.read()
        return json_response(await client_runs.client_tool_completion(run_id, body["seq"], body))
