"""Checks of values against recorded JSON schemas (suspension inputs) and the
budget-extension shape.

A schema that names ``required`` or ``properties`` without a ``type`` is read
as asking for an object, so a bare ``null``, number or string is refused even
though plain JSON Schema would let it pass vacuously.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

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


# Keywords whose value maps names to sub-schemas (the map itself is no schema),
# and keywords whose value is data, never a schema.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs"})
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


# Recursion: one frame per level; a schema comes from a definition, which is at most MAX_NESTING
# (128) levels deep (checked when it is parsed), far under Python's limit of 1000.
def _objectify(schema: Any) -> Any:
    """Give every sub-schema with ``required``/``properties`` and no ``type`` an object type."""
    if isinstance(schema, list):
        return [_objectify(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _objectify(sub) for name, sub in value.items()}
        else:
            out[key] = _objectify(value)
    if "type" not in out and ("required" in out or "properties" in out):
        out["type"] = "object"
    return out


class _NoRemoteRefs(dict):
    """Ref handlers that claim every URI scheme and resolve none of them.

    Without a handler fastjsonschema fetches a remote ``$ref`` with urlopen
    (http, file, ...): a schema from a run's log must never make a check do IO.
    """

    def __contains__(self, scheme: object) -> bool:
        return True

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return _refuse_remote_ref


def _refuse_remote_ref(uri: str) -> Any:
    raise fastjsonschema.JsonSchemaDefinitionException(f"remote $ref {uri!r} is not resolved")


@functools.lru_cache(maxsize=512)
def _compiled(schema_bytes: bytes) -> Callable[[Any], Any]:
    schema = _objectify(json.loads(schema_bytes))
    try:
        return fastjsonschema.compile(schema, handlers=_NoRemoteRefs())
    except Exception as exc:  # noqa: BLE001
        # fastjsonschema does not check a schema against its meta-schema, so a
        # malformed one fails in arbitrary ways (TypeError, re.error, ...):
        # every one of them means the schema is unusable.
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
        # fastjsonschema names the failing value "data.items[1].id" (its
        # ``path`` list spells array indices as strings, so it cannot tell
        # [1] from .1); the name is the path with "data" for the root, and the
        # message opens with it.
        name = exc.name or "data"
        path = "$" + name[len("data") :] if name.startswith("data") else "$"
        message = path + exc.message[len(name) :] if exc.message.startswith(name) else exc.message
        raise SchemaViolation(
            f"{what} does not satisfy the recorded schema: {message}",
            violations=[{"path": path, "message": message}],
        ) from None
    except RecursionError:
        # A self-referential schema can recurse without end on some values.
        message = "the recorded schema recurses without end on this value"
        raise SchemaViolation(
            f"{what} could not be checked: {message}",
            violations=[{"path": "$", "message": message}],
        ) from None


def validate_budget_extension(value: Any) -> None:
    """Check a budget-exceeded run's resume input: ``{"extend_by": <number > 0>}``.

    Raises:
        SchemaViolation: the value is not that shape.
    """
    validate(BUDGET_EXTENSION_SCHEMA, value, what="a budget extension")
