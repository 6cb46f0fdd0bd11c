"""Suggestions for a misspelt node id or case: the nearest existing one, at a bounded cost.

Rules: ``difflib`` over at most ``DIFFLIB_CHOICES`` choices; in a larger
graph, only the choices one edit away; at most ``MAX_SUGGESTIONS`` distinct
words per document, none longer than 128 characters; every other word gets
null. Whatever a document holds, its suggestions cost milliseconds (difflib
over 10,000 ids takes 40-300 ms a word).
"""

from __future__ import annotations

import difflib
from typing import Any

DIFFLIB_CHOICES = 500
MAX_SUGGESTIONS = 32
# What a node id is made of: the alphabet of the one-edit neighbours tried in a large graph.
_ID_CHARACTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
_LONGEST_ID = 64
# No suggestion for a longer word: difflib's cost grows with the square of the lengths.
_LONGEST_SUGGESTED = 2 * _LONGEST_ID


def nearest(word: str, choices: Any) -> str | None:
    """The choice difflib finds closest to ``word`` (unbounded: for a handful of choices)."""
    found = difflib.get_close_matches(word, choices, n=1)
    return found[0] if found else None


def _one_edit_away(word: str, ids: dict[str, int]) -> str | None:
    """The earliest id (by ``ids``' positions) one deletion, transposition, replacement or
    insertion away from ``word``."""
    if len(word) > _LONGEST_ID + 1:
        return None
    splits = [(word[:cut], word[cut:]) for cut in range(len(word) + 1)]
    near = {left + right[1:] for left, right in splits if right}
    near |= {left + right[1] + right[0] + right[2:] for left, right in splits if len(right) > 1}
    for left, right in splits:
        for char in _ID_CHARACTERS:
            near.add(left + char + right)
            if right:
                near.add(left + char + right[1:])
    hits = [candidate for candidate in near if candidate in ids and candidate != word]
    return min(hits, key=ids.__getitem__) if hits else None


class Suggester:
    """The nearest node id (or case) to a misspelt one, within the bounds the module states;
    one per document, since the bound on words is per document."""

    def __init__(self) -> None:
        self._answers: dict[tuple[str, str], str | None] = {}

    def __call__(self, word: str, choices: Any, pool: str = "nodes") -> str | None:
        """The nearest of ``choices`` (ids or cases, in document order) to ``word``; answers are
        kept per ``pool`` (what the choices are)."""
        key = (pool, word)
        if key in self._answers:
            return self._answers[key]
        if len(self._answers) >= MAX_SUGGESTIONS or len(word) > _LONGEST_SUGGESTED:
            return None
        if len(choices) <= DIFFLIB_CHOICES:
            found = nearest(word, choices)
        else:
            found = _one_edit_away(word, {choice: i for i, choice in enumerate(choices)})
        self._answers[key] = found
        return found
