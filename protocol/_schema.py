"""Checks of values against recorded JSON schemas (suspension inputs) and the
budget-extension shape.

A schema that names ``required`` or ``properties`` without a ``type`` is read
as asking for an object, so a bare ``null``, number or string is refused even
though plain JSON Schema would let it pass vacuously.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable

import fastjsonschema

from ._canonical import canonical_json
from ._errors import MalformedEvent, SchemaViolation

# The one shape a budget-exceeded run is resumed with: how much more of the
# crossed budget to allow.
BUDGET_EXTENSION_SCHEMA = {
    "type": "object",
    "required": ["extend_by"],
    "properties": {"extend_by": {"type": "number", "exclusiveMinimum": 0}},
    "additionalProperties": False,
}


def _objectify(schema: Any) -> Any:
    """Give every sub-schema with ``required``/``properties`` and no ``type`` an object type."""
    if isinstance(schema, list):
        return [_objectify(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _objectify(value) for key, value in schema.items()}
    if "type" not in out and ("required" in out or "properties" in out):
        out["type"] = "object"
    return out


@functools.lru_cache(maxsize=512)
def _compiled(schema_bytes: bytes) -> Callable[[Any], Any]:
    schema = _objectify(json.loads(schema_bytes))
    try:
        return fastjsonschema.compile(schema)
    except fastjsonschema.JsonSchemaDefinitionException as exc:
        raise MalformedEvent(f"not a usable JSON schema: {exc}") from None


def check_schema(schema: Any) -> None:
    """Confirm a schema compiles.

    Raises:
        MalformedEvent: it is not an object or is not a usable JSON schema.
    """
    if not isinstance(schema, dict):
        raise MalformedEvent("a JSON schema must be an object")
    _compiled(canonical_json(schema))


def validate(schema: dict, value: Any, *, what: str = "the input") -> None:
    """Check ``value`` against ``schema``.

    Raises:
        SchemaViolation: the value does not satisfy the schema; its
            ``violations`` list carries ``{"path", "message"}`` entries.
        MalformedEvent: the schema itself is unusable.
    """
    check = _compiled(canonical_json(schema))
    try:
        check(value)
    except fastjsonschema.JsonSchemaValueException as exc:
        path = "$" + "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in exc.path[1:]
        )
        message = exc.message.replace("data", path, 1) if exc.message.startswith("data") else exc.message
        raise SchemaViolation(
            f"{what} does not satisfy the recorded schema: {message}",
            violations=[{"path": path, "message": message}],
        ) from None


def validate_budget_extension(value: Any) -> None:
    """Check a budget-exceeded run's resume input: ``{"extend_by": <number > 0>}``.

    Raises:
        SchemaViolation: the value is not that shape.
    """
    validate(BUDGET_EXTENSION_SCHEMA, value, what="a budget extension")
