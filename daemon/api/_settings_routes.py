"""The operator's settings: ``GET`` and ``PUT /v1/settings/edit-mode`` (whether agents are offered
the flow authoring tools).

The setting lives in the store, not in this process: every daemon on the store and ``salvor
edit-mode`` read and write the same row, and a run's loop reads it before each model call. A
refused ``PUT`` (not ``{"enabled": true|false}``) changes nothing.
"""

from __future__ import annotations

from quart_trio import QuartTrio

from ._operation import Operation, route
from ._settings_schemas import EDIT_MODE, EDIT_MODE_STATE
from ._state import ServerState

READ_EDIT_MODE = Operation(
    method="get",
    rule="/v1/settings/edit-mode",
    operation_id="getEditMode",
    tag="settings",
    summary="Whether the flow authoring tools are offered (edit mode); off by default",
    answers={"200": ("Edit mode, as the store holds it.", EDIT_MODE_STATE)},
)
SET_EDIT_MODE = Operation(
    method="put",
    rule="/v1/settings/edit-mode",
    operation_id="setEditMode",
    tag="settings",
    summary="Turn edit mode on or off for every run of the store",
    description=(
        "Kept in the store, so every daemon on it and `salvor edit-mode` see the same value. A "
        "live run of an agent that opted into an authoring tool sees the change at its next model "
        "call, without a restart."
    ),
    body=EDIT_MODE,
    answers={"200": ("The setting now.", EDIT_MODE_STATE)},
    refusals=("BadRequest", "PayloadTooLarge"),
)
OPERATIONS = (READ_EDIT_MODE, SET_EDIT_MODE)


def add_settings_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, READ_EDIT_MODE)
    async def edit_mode():
        return EDIT_MODE_STATE.respond(enabled=await runtime.definitions.edit_mode())

    @route(app, SET_EDIT_MODE)
    async def set_edit_mode():
        body = await EDIT_MODE.read()
        await runtime.definitions.set_edit_mode(body["enabled"])
        return EDIT_MODE_STATE.respond(enabled=body["enabled"])
