"""The rules every kind of agent definition holds its fields to, and the hash that names it.

Each check raises ``DefinitionError`` with one sentence and ``at``, the path of the field it is
about; none of them reads a file or the daemon's environment.
"""

from __future__ import annotations

from typing import Any

from salvor.protocol import (
    BadDeclaration,
    DeclaredInput,
    DeclaredOutput,
    parse_inputs,
    parse_outputs,
    sha256_hash,
)

from ._definition_error import DefinitionError, did_you_mean, suggest

MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
# The longest each duration a definition sets may be, in seconds, with how a refusal says it. A
# bound refuses nonsense (1e300 passes every positivity check and overflows the first timer or
# date it reaches), not a policy: each lies far past what its field needs.
# One life of a process or service agent's process (one drive): a run that waits on a person or
# a timer has its process stopped, so this times work alone, and a week is past any agent's
# single stretch of it.
MAX_PROCESS_TIMEOUT = (7 * 86400.0, "7 days")
# One model call, a streamed answer included.
MAX_LLM_TIMEOUT = (3600.0, "1 hour")
# A run's whole life, its sleeps and its waits on people included (leave the budget out for none).
MAX_WALL_TIME_BUDGET = (365 * 86400.0, "365 days")


def expect(
    cond: bool, message: str, at: tuple[str | int, ...] = (), suggestion: str | None = None
) -> None:
    if not cond:
        raise DefinitionError(message, at=at, suggestion=suggestion)


def check_keys(where: str, table: Any, allowed: set[str], at: tuple[str | int, ...] = ()) -> None:
    expect(isinstance(table, dict), f"`{where}` must be a table", at)
    unknown = unknown_keys(where, table, allowed, at)
    if unknown:
        raise unknown[0]


def unknown_keys(
    where: str, table: dict, allowed: set[str], at: tuple[str | int, ...] = ()
) -> list[DefinitionError]:
    """A refusal for each key of ``table`` not in ``allowed``, in sorted order (``check_keys``
    raises the first), each with the nearest allowed key as its suggestion."""
    found = []
    for key in sorted(set(table) - allowed):
        near = suggest(key, allowed)
        found.append(
            DefinitionError(
                f"unknown field `{key}` in {where}{did_you_mean(near)}; "
                f"allowed: {', '.join(sorted(allowed))}",
                at=(*at, key),
                suggestion=near,
            )
        )
    return found


def whole(value: Any) -> bool:
    """An integer as JSON means one: 3 and 3.0 are the same number (and hash alike in RFC 8785)."""
    return type(value) is int or (type(value) is float and value.is_integer())


def positive_number(where: str, value: Any, at: tuple[str | int, ...]) -> None:
    expect(type(value) in (int, float) and value > 0, f"`{where}` must be a positive number", at)


def duration(where: str, value: Any, at: tuple[str | int, ...], bound: tuple[float, str]) -> None:
    """A positive number of seconds no longer than ``bound`` (seconds, and how to say them)."""
    most, said = bound
    expect(
        type(value) in (int, float) and 0 < value <= most,
        f"`{where}` must be a positive number of seconds, at most {most:.0f} ({said})",
        at,
    )


def definition_hash(normalised: dict) -> str:
    try:
        return sha256_hash(normalised)
    except ValueError as exc:  # NaN, an infinity, a lone surrogate: nothing canonical JSON carries
        raise DefinitionError(f"the definition holds a value JSON cannot carry: {exc}") from None


def display_name(raw: dict) -> str | None:
    name = raw.get("name")
    if name is not None:
        expect(isinstance(name, str), "`name` must be a string", ("name",))
        expect(name.strip() != "", "`name` must not be empty or all whitespace", ("name",))
        expect(
            len(name) <= MAX_NAME_CHARS,
            f"`name` must be at most {MAX_NAME_CHARS} characters",
            ("name",),
        )
    return name


def record_prompts(raw: dict) -> bool:
    recorded = raw.get("record_prompts", False)
    expect(
        isinstance(recorded, bool),
        "`record_prompts` must be true or false",
        ("record_prompts",),
    )
    return recorded


def declarations(
    raw: dict,
) -> tuple[str | None, tuple[DeclaredInput, ...], tuple[DeclaredOutput, ...]]:
    """What a built-in and a process agent both declare for the catalog: ``description``,
    ``inputs``, ``outputs``."""
    # Absent is none; a null is refused as any other non-string (the document says a string).
    description = raw.get("description")
    if "description" in raw:
        expect(isinstance(description, str), "`description` must be a string", ("description",))
        expect(
            len(description) <= MAX_DESCRIPTION_CHARS,
            f"`description` must be at most {MAX_DESCRIPTION_CHARS} characters",
            ("description",),
        )
    try:
        inputs = parse_inputs(raw["inputs"]) if "inputs" in raw else ()
    except BadDeclaration as exc:
        raise DefinitionError(str(exc), at=("inputs",)) from None
    try:
        outputs = parse_outputs(raw["outputs"]) if "outputs" in raw else ()
    except BadDeclaration as exc:
        raise DefinitionError(str(exc), at=("outputs",)) from None
    return description, inputs, outputs
