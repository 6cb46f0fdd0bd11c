"""The operator's settings: ``GET`` and ``PUT /v1/settings/edit-mode`` (whether agents are offered
the flow authoring tools).

The setting lives in the store, not in this process: every daemon on the store and ``salvor
edit-mode`` read and write the same row, and a run's loop reads it before each model call. A
refused ``PUT`` (not ``{"enabled": true|false}``) changes nothing.
"""

from __future__ import annotations

from quart_trio import QuartTrio

from ._settings_schemas import EDIT_MODE, EDIT_MODE_STATE
from ._state import ServerState


def add_settings_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @app.get("/v1/settings/edit-mode")
    async def edit_mode():
        return EDIT_MODE_STATE.respond(enabled=await runtime.edit_mode())

    @app.put("/v1/settings/edit-mode")
    async def set_edit_mode():
        body = await EDIT_MODE.read()
        await runtime.set_edit_mode(body["enabled"])
        return EDIT_MODE_STATE.respond(enabled=body["enabled"])
