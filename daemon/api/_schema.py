"""JSON Schema building blocks the request bodies and the OpenAPI document share.

Plain data and pure functions: a reference into ``components``, a closed
object, a nullable value, and the few primitive shapes every body uses.
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]

SEQ: JSON = {"type": "integer", "minimum": 0}
ANY: JSON = {"description": "Any JSON value."}
INSTANT: JSON = {
    "type": "string",
    "format": "date-time",
    "description": "RFC 3339, UTC, the store's clock.",
}
HASH_PATTERN = "^sha256:[0-9a-f]{64}$"


def ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


def closed(properties: JSON, required: list[str] | tuple[str, ...] = (), **extra: Any) -> JSON:
    """A closed object: the listed properties, nothing else."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
        **extra,
    }


def nullable(schema: JSON) -> JSON:
    """``schema``, or null (which the route reads as the field left out)."""
    return {"oneOf": [schema, {"type": "null"}]}


def exactly(table: str, fields: frozenset[str], properties: JSON) -> JSON:
    """``properties``, once they name exactly the ``fields`` the code that reads ``table`` takes.

    Raises:
        RuntimeError: at import, so code that gains or drops a field fails every test until the
            document describes it.
    """
    if set(properties) != fields:
        raise RuntimeError(
            f"the OpenAPI document describes {table} with {sorted(properties)}, but the "
            f"daemon takes {sorted(fields)}"
        )
    return properties
