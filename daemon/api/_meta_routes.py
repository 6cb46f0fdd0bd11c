"""What the server says about itself: ``GET /v1/capabilities``, ``/v1/health`` and
``/v1/openapi.json``."""

from __future__ import annotations

from quart_trio import QuartTrio
from salvor import __version__

from ._answers import CAPABILITIES, HEALTH
from ._http import json_response
from ._openapi import openapi_document
from ._state import ServerState


def add_meta_routes(app: QuartTrio, state: ServerState) -> None:
    @app.get("/v1/capabilities")
    async def capabilities():
        server = {"version": __version__}
        if state.commit:
            server["commit"] = state.commit
        # Advertised only when it exists on this server (POST /v1/runs/{id}/fork).
        return CAPABILITIES.respond(capabilities={"fork": True}, server=server)

    @app.get("/v1/health")
    async def health():
        # Answered from memory, never from the store: it must answer at once
        # while recovery (or a store fault) keeps the store busy.
        return HEALTH.respond(
            status="ok", recovering=state.drivers.recovering, healing=len(state.drivers.healing)
        )

    @app.get("/v1/openapi.json")
    async def openapi():
        return json_response(
            openapi_document(
                tools=state.runtime.registry.names(),
                process_agents=state.allow_process_agents,
                llm_choices=state.credentials.llm_choices(),
            )
        )
