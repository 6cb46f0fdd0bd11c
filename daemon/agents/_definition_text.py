"""Reading a definition's text: TOML, JSON or a markdown agent file, into one table.

Whatever the format, the table is held to strict JSON's rules before any field is looked at, so
every kind's parser sees the same values and the hash is the same for the same fields.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from salvor.protocol import (
    MAX_NESTING,
    MalformedJson,
    check_document,
    check_nesting,
    parse_strict,
)

from ._definition_error import DefinitionError
from ._definition_rules import expect
from ._markdown import MarkdownAgent, read_markdown

# The text of one definition, in any format. A system prompt of a million bytes is far past any
# model's context; the bound keeps a parse well under a second.
MAX_DEFINITION_BYTES = 1024 * 1024
# The formats a definition's text comes in (and the store keeps).
FORMATS = ("toml", "json", "md")


def format_of(path: str | Path) -> str:
    """The format an agent file's name says: ``.json`` is JSON, ``.md`` markdown, else TOML."""
    suffix = Path(path).suffix.lower()
    return {".json": "json", ".md": "md", ".markdown": "md"}.get(suffix, "toml")


def read_document(text: str, fmt: str, stored: bool) -> tuple[dict, MarkdownAgent | None]:
    """The definition's table as its text holds it (a markdown file's: its front matter read as
    the TOML fields it stands for), held to strict JSON's rules."""
    expect(fmt in FORMATS, f"an agent definition is TOML, JSON or markdown, not {fmt!r}")
    # A stored copy was held to the bound of its day; a new one to this one, before it is parsed.
    if not stored and len(text) * 4 > MAX_DEFINITION_BYTES:
        size = len(text.encode("utf-8", "surrogatepass"))
        expect(
            size <= MAX_DEFINITION_BYTES,
            f"the definition is {size} bytes; a definition may be at most "
            f"{MAX_DEFINITION_BYTES} bytes (1 MiB)",
        )
    markdown = None
    try:
        if fmt == "md":
            markdown = read_markdown(text)
            raw: Any = markdown.fields
        elif fmt == "toml":
            raw = tomllib.loads(text)
        else:
            raw = parse_strict(text, "the definition", big_integers=stored)
        # TOML nests through dotted keys and tables too, and carries what JSON cannot (dates, inf,
        # 64-bit integers): the parsed value is held to strict JSON's rules, by a stack (a stored
        # copy only to the depth bound it was accepted under).
        (check_nesting if stored else check_document)(raw, "the definition")
    except MalformedJson as exc:
        raise DefinitionError(exc.message) from None
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        if isinstance(exc, DefinitionError):
            raise
        raise DefinitionError(f"the definition is not valid {fmt.upper()}: {exc}") from None
    except RecursionError:  # tomllib's parser recurses on nested arrays and inline tables
        raise DefinitionError(
            f"the definition nests too deeply; the limit is {MAX_NESTING} levels"
        ) from None
    expect(isinstance(raw, dict), "`the definition` must be a table")
    return raw, markdown
