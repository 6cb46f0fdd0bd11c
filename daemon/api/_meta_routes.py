"""What the server says about itself: ``GET /v1/capabilities``, ``/v1/health`` and
``/v1/openapi.json`` (the document built from the declarations of the routes this app has)."""

from __future__ import annotations

from quart_trio import QuartTrio
from salvor import __version__

from ..web import off_loop
from ._answers import CAPABILITIES, HEALTH
from ._http import json_response
from ._openapi import openapi_document
from ._operation import Operation, operations_of, route
from ._state import ServerState

CAPABILITIES_READ = Operation(
    method="get",
    rule="/v1/capabilities",
    operation_id="getCapabilities",
    tag="server",
    summary="What this server can do, and which build it is",
    answers={"200": ("Capabilities and the server's build.", CAPABILITIES)},
)
HEALTH_READ = Operation(
    method="get",
    rule="/v1/health",
    operation_id="getHealth",
    tag="server",
    summary="Whether the daemon answers, and how many runs it is still recovering or healing",
    answers={"200": ("The daemon answers (from memory: it never reads the store).", HEALTH)},
)
DOCUMENT_READ = Operation(
    method="get",
    rule="/v1/openapi.json",
    operation_id="getOpenApi",
    tag="server",
    summary="This document",
    answers={"200": ("The OpenAPI 3.1 document.", {"type": "object"})},
)
OPERATIONS = (CAPABILITIES_READ, HEALTH_READ, DOCUMENT_READ)


def add_meta_routes(app: QuartTrio, state: ServerState) -> None:
    @route(app, CAPABILITIES_READ)
    async def capabilities():
        server = {"version": __version__}
        if state.commit:
            server["commit"] = state.commit
        # Advertised only when it exists on this server (POST /v1/runs/{id}/fork; a flow's
        # files read from the members a client sends with POST /v1/graph-runs).
        return CAPABILITIES.respond(
            capabilities={"fork": True, "flow_members": True}, server=server
        )

    @route(app, HEALTH_READ)
    async def health():
        # Answered from memory, never from the store: it must answer at once
        # while recovery (or a store fault) keeps the store busy.
        return HEALTH.respond(
            status="ok",
            recovering=state.drivers.recovering,
            healing=len(state.drivers.healing),
            worker=state.worker,  # left out when None (a daemon of one process)
        )

    @route(app, DOCUMENT_READ)
    async def openapi():
        # Read at the first request, when every route is registered (the URL map is the truth).
        registry = state.runtime.kit.registry
        skills = await off_loop(registry.skills.names)  # a look in the skill directories
        return json_response(
            openapi_document(
                operations_of(app),
                tools=registry.names(),
                skills=skills,
                process_agents=state.allow_process_agents,
                llm_choices=state.credentials.llm_choices(),
                mcp_origins=state.credentials.origins("mcp"),
                service_origins=state.credentials.origins("service"),
            )
        )
