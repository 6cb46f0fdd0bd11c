"""What a flow's agent declares it takes and gives back, pure: its ``inputs`` (names a caller
fills) and ``outputs`` (what its ``finish`` must carry, each with a JSON type), parsed from a
definition and refused in one sentence naming the entry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

OUTPUT_TYPES = ("string", "number", "boolean", "object", "array")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# Names a finish reserves for itself: an output may not take one.
_FINISH_FIELDS = frozenset({"status", "summary", "branch", "outputs"})


class BadDeclaration(ValueError):
    """Declared inputs or outputs that do not parse; the message names the entry."""


@dataclass(frozen=True, slots=True)
class DeclaredInput:
    """An input an agent takes by name (a subagent call's ``inputs`` entry)."""

    name: str
    description: str | None = None


@dataclass(frozen=True, slots=True)
class DeclaredOutput:
    """A typed output an agent's ``finish`` carries; required when its status is ``complete``."""

    name: str
    type: str = "string"
    description: str | None = None
    required: bool = True

    def schema(self) -> dict:
        schema: dict[str, Any] = {"type": self.type}
        if self.description:
            schema["description"] = self.description
        return schema


def _name(where: str, value: Any, reserved: frozenset[str] = frozenset()) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise BadDeclaration(
            f"{where} needs a name of letters, digits and `_` (up to 64, not starting with a "
            f"digit), not {value!r}"
        )
    if value in reserved:
        raise BadDeclaration(f"{where} is named {value!r}, which finish uses for itself")
    return value


def _description(where: str, entry: dict) -> str | None:
    # Absent is no description; a null is refused like any other non-string (as JSON Schema says).
    if "description" not in entry:
        return None
    if not isinstance(entry["description"], str):
        raise BadDeclaration(f"{where}: `description` must be a string")
    return entry["description"]


def _entries(where: str, value: Any) -> list:
    if not isinstance(value, list):
        raise BadDeclaration(f"`{where}` must be an array of names or of tables with a `name`")
    return value


def parse_inputs(value: Any, where: str = "inputs") -> tuple[DeclaredInput, ...]:
    """Declared inputs: an array of names, or of ``{name, description?}`` tables.

    Raises:
        BadDeclaration: one sentence naming the entry.
    """
    found: list[DeclaredInput] = []
    for index, entry in enumerate(_entries(where, value)):
        at = f"`{where}` entry {index + 1}"
        if isinstance(entry, str):
            found.append(DeclaredInput(_name(at, entry)))
            continue
        if not isinstance(entry, dict) or set(entry) - {"name", "description"}:
            raise BadDeclaration(f"{at} must be a name or a table of `name` and `description`")
        found.append(DeclaredInput(_name(at, entry.get("name")), _description(at, entry)))
    _unique(where, found)
    return tuple(found)


def parse_outputs(value: Any, where: str = "outputs") -> tuple[DeclaredOutput, ...]:
    """Declared outputs: an array of names (strings), or of ``{name, type?, description?,
    required?}`` tables; ``type`` is one of ``OUTPUT_TYPES`` (default ``string``).

    Raises:
        BadDeclaration: one sentence naming the entry.
    """
    found: list[DeclaredOutput] = []
    for index, entry in enumerate(_entries(where, value)):
        at = f"`{where}` entry {index + 1}"
        if isinstance(entry, str):
            found.append(DeclaredOutput(_name(at, entry, _FINISH_FIELDS)))
            continue
        if not isinstance(entry, dict) or set(entry) - {"name", "type", "description", "required"}:
            raise BadDeclaration(
                f"{at} must be a name or a table of `name`, `type`, `description` and `required`"
            )
        kind = entry.get("type", "string")
        if kind not in OUTPUT_TYPES:
            raise BadDeclaration(
                f"{at}: `type` must be one of {', '.join(OUTPUT_TYPES)}, not {kind!r}"
            )
        required = entry.get("required", True)
        if not isinstance(required, bool):
            raise BadDeclaration(f"{at}: `required` must be true or false")
        found.append(
            DeclaredOutput(
                _name(at, entry.get("name"), _FINISH_FIELDS),
                kind,
                _description(at, entry),
                required,
            )
        )
    _unique(where, found)
    return tuple(found)


def _unique(where: str, entries: Sequence[DeclaredInput | DeclaredOutput]) -> None:
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise BadDeclaration(f"`{where}` names {entry.name!r} twice")
        seen.add(entry.name)
