"""The shapes of the operator's settings over HTTP: edit mode's body (``PUT
/v1/settings/edit-mode``) and its answer (that route's and ``GET``'s).

Declared once: the handlers read and answer with these, and the OpenAPI document is built from
them. Plain data, built at import.
"""

from __future__ import annotations

from typing import Any

from ..web import bad_request
from ._answers import Answer
from ._body import Body, Field
from ._schema import JSON

_ENABLED_DESCRIPTION = (
    "Whether the flow authoring tools (flow_agents, flow_write) are offered to the main session "
    "of agents that opted into them, from each run's next model call."
)


def _enabled(value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad_request("`enabled` must be true or false")
    return value


EDIT_MODE = Body(
    "EditModeChange",
    (
        Field(
            name="enabled",
            required=True,
            schema={"type": "boolean"},
            check=_enabled,
            description=_ENABLED_DESCRIPTION,
        ),
    ),
)
EDIT_MODE_STATE = Answer(
    "EditMode",
    (
        Field(
            name="enabled",
            required=True,
            schema={"type": "boolean"},
            description=_ENABLED_DESCRIPTION + " Off until an operator turns it on.",
        ),
    ),
    description="Edit mode, as the store holds it.",
)

SETTINGS_ANSWERS = (EDIT_MODE_STATE,)
SETTINGS_SCHEMAS: JSON = {EDIT_MODE.name: EDIT_MODE.schema()}
