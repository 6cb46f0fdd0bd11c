"""The one refusal of an agent definition, and where in the definition it points.

Kept apart from the parsers so each format's reader (TOML and JSON in ``_definition``, markdown in
``_markdown``) raises the same error without importing the others.
"""

from __future__ import annotations

from collections.abc import Iterable

from salvor.protocol import nearest


class DefinitionError(ValueError):
    """The definition does not validate; the message is one sentence naming the field.

    ``at``: the path of the offending field in the definition's table (keys, and an entry's index
    in an array such as ``[[tools]]``), ``()`` when the fault is the whole document; the
    diagnostics turn it into a line of the text. ``suggestion``: the nearest valid spelling of a
    misspelt name, when there is one.
    """

    def __init__(
        self, message: str, *, at: tuple[str | int, ...] = (), suggestion: str | None = None
    ) -> None:
        super().__init__(message)
        self.at = at
        self.suggestion = suggestion


def suggest(word: str, choices: Iterable[str]) -> str | None:
    """The choice difflib finds closest to ``word``, or None (for a handful of choices)."""
    return nearest(word, list(choices))


def did_you_mean(suggestion: str | None) -> str:
    """What a refusal's sentence says of a near spelling: `` (did you mean `x`?)``, or nothing."""
    return f" (did you mean `{suggestion}`?)" if suggestion else ""
