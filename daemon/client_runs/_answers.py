"""The JSON answers of a client-driven run's routes, each declared once as a ``Shape``.

The functions that answer (``_steps``, ``_performed``, ``_appends``, a declaration's
``to_json``) build their answer through its shape, and the OpenAPI document's schema for it is
``shape.schema()``: a field one of them writes that the other does not describe raises when the
answer is built (a bug; the client gets the 500 envelope and the tests drive every answer).
"""

from __future__ import annotations

from salvor.protocol import ANY, HASH_PATTERN, SEQ, Effect, Shape, ref

_EFFECT = {"enum": [effect.value for effect in Effect]}
_SETTLED = {"type": "boolean", "description": "Whether the call is already completed in the log."}

CLIENT_TOOL = Shape(
    "ClientTool",
    {
        "name": {"type": "string"},
        "effect": _EFFECT,
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "trust_completion": {"type": "boolean"},
        "idempotency_key": {"type": "array", "items": {"type": "string"}},
        "require_equal": {"type": "array", "items": {"type": "string"}},
    },
    ("name", "effect", "input_schema", "trust_completion"),
)
CLIENT_TOOL_OPENED = Shape(
    "ClientToolOpened",
    {
        "seq": SEQ,
        "idempotency_key": {"type": "string", "pattern": HASH_PATTERN},
        "effect": _EFFECT,
        "settled": _SETTLED,
        "output": ANY,
    },
    ("seq", "idempotency_key", "effect", "settled"),
)
CLIENT_MODEL_OPENED = Shape(
    "ClientModelOpened",
    {"seq": SEQ, "settled": _SETTLED, "response": ANY, "usage": ref("Usage")},
    ("seq", "settled"),
)
COMPLETED = Shape("Completed", {"seq": SEQ, "completed": {"const": True}}, ("seq", "completed"))
MODEL_STEP_DONE = Shape(
    "ModelStepDone", {"response": {"type": "object"}, "usage": ref("Usage")}, ("response", "usage")
)
TOOL_STEP_DONE = Shape("ToolStepDone", {"output": ANY}, ("output",))
APPENDED = Shape("Appended", {"appended": {"type": "array", "items": SEQ}}, ("appended",))

CLIENT_RUN_ANSWERS = (
    CLIENT_TOOL,
    CLIENT_TOOL_OPENED,
    CLIENT_MODEL_OPENED,
    COMPLETED,
    MODEL_STEP_DONE,
    TOOL_STEP_DONE,
    APPENDED,
)
