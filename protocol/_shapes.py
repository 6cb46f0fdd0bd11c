"""JSON Schema building blocks, and ``Shape``: a JSON object's fields declared once.

The wire shapes salvor emits are described by the same declarations the code
that builds them reads, so a field added, dropped or renamed in one place and
not the other fails at import (``exactly``) or the moment it is built
(``Shape.check``), never silently in the OpenAPI document. A ``$ref`` here
names a schema under ``#/components/schemas`` of the document these
fragments are assembled into. Plain data and pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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


def closed(properties: JSON, required: Iterable[str] = (), **extra: Any) -> JSON:
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


def exactly(table: str, fields: Iterable[str], properties: JSON) -> JSON:
    """``properties``, once they name exactly the ``fields`` the code that reads or builds
    ``table`` uses.

    Raises:
        RuntimeError: at import, so code that gains or drops a field fails every test until the
            document describes it.
    """
    fields = set(fields)
    if set(properties) != fields:
        raise RuntimeError(
            f"the OpenAPI document describes {table} with {sorted(properties)}, but the "
            f"code uses {sorted(fields)}"
        )
    return properties


@dataclass(frozen=True, slots=True)
class Shape:
    """A JSON object's declared fields: all a builder may put in it, and what the document says.

    ``properties`` maps each field to its JSON Schema; ``required`` names those always present.
    """

    name: str
    properties: Mapping[str, JSON]
    required: tuple[str, ...] = ()
    description: str = ""
    # More of the document's rules beyond the fields themselves (``if``/``then``, ...).
    rules: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.required) - set(self.properties)
        if unknown:
            raise RuntimeError(f"{self.name} requires {sorted(unknown)}, which it does not declare")

    def check(self, body: dict) -> dict:
        """``body``, once its keys are the declaration's: none beyond it, none required missing.

        Raises:
            RuntimeError: the builder and the declaration disagree (a bug); nothing is sent.
        """
        if not (self.properties.keys() >= body.keys() and body.keys() >= set(self.required)):
            raise RuntimeError(
                f"the {self.name} answer was built with {sorted(body)}; it takes "
                f"{sorted(self.properties)} and needs {sorted(self.required)}"
            )
        return body

    def build(self, **values: Any) -> dict:
        """The object of these fields, in the order given (``check`` applies)."""
        return self.check(values)

    def schema(self) -> JSON:
        extra = {"description": self.description} if self.description else {}
        return closed(dict(self.properties), self.required, **extra, **self.rules)
