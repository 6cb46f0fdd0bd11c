"""The field checks an event runs on itself when built (``Event.__post_init__``).

Each names the event's kind and the field in its ``MalformedEvent``, so a refused payload says
which field of which kind was wrong.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from ._clock import parse_instant
from ._errors import MalformedEvent
from ._event_kinds import Actor


class Kinded(Protocol):
    """What ``check_actor`` reads of the event it checks besides the field: its kind. An
    ``Event``, whose codec runs these checks, so they name only what they read, and the two
    modules import one way."""

    KIND: ClassVar[str]


def malformed(kind: str, message: str) -> MalformedEvent:
    return MalformedEvent(f"{kind}: {message}")


def check_actor(event: Kinded, name: str, *allowed: Actor) -> None:
    """Check an optional actor field is one of ``allowed`` or absent, and hold it as the member."""
    value = getattr(event, name)
    if value is not None:
        if value not in allowed:
            named = ", ".join(f'"{actor}"' for actor in allowed)
            raise malformed(event.KIND, f"`{name}` is {named} or absent")
        object.__setattr__(event, name, Actor(value))


def check_str(kind: str, name: str, value: Any, *, allow_empty: bool = False) -> None:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise malformed(kind, f"`{name}` must be a non-empty string")


def check_seq(kind: str, name: str, value: Any) -> None:
    if type(value) is not int or value < 0:
        raise malformed(kind, f"`{name}` must be a non-negative integer")


def check_number(kind: str, name: str, value: Any) -> None:
    if type(value) not in (int, float) or value < 0:
        raise malformed(kind, f"`{name}` must be a non-negative number")


def check_exact_keys(kind: str, name: str, value: Any, keys: frozenset[str]) -> None:
    if not isinstance(value, dict) or value.keys() != keys:
        raise malformed(kind, f"`{name}` must be an object with exactly {sorted(keys)}")


def check_instant(kind: str, name: str, value: Any) -> None:
    try:
        parse_instant(value)
    except ValueError as exc:
        raise malformed(kind, f"`{name}` must be an RFC 3339 instant ({exc})") from None


USAGE_KEYS = frozenset({"input_tokens", "output_tokens"})


def check_usage(kind: str, usage: Any) -> None:
    check_exact_keys(kind, "usage", usage, USAGE_KEYS)
    check_seq(kind, "usage.input_tokens", usage["input_tokens"])
    check_seq(kind, "usage.output_tokens", usage["output_tokens"])
