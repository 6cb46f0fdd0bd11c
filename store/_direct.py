"""Core statements compiled once for a dialect and run straight on a DBAPI cursor.

The append path is the store's hot path: one append costs little more than
the commit's fsync only if the SQLAlchemy execution machinery (contexts,
result objects, events) stays out of it. The statements are still built with
Core, in one place; this module compiles each once for the store's dialect
and keeps the SQL text and the order its parameters go in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Dialect
from sqlalchemy.sql import ClauseElement


class DirectStatement:
    """One compiled statement and how to turn a row dict into its DBAPI parameters."""

    __slots__ = ("params", "sql")

    def __init__(
        self, statement: ClauseElement, dialect: Dialect, *, keys: Sequence[str] | None = None
    ) -> None:
        compiled = statement.compile(dialect=dialect, column_keys=list(keys) if keys else None)
        self.sql: str = compiled.string
        self.params: Callable[[dict], Any]
        if compiled.positional:
            names = tuple(compiled.positiontup or ())
            self.params = lambda row: tuple([row[name] for name in names])
        else:
            self.params = _identity

    def execute(self, cursor: Any, row: dict) -> Any:
        cursor.execute(self.sql, self.params(row))
        return cursor

    def executemany(self, cursor: Any, rows: Sequence[dict]) -> int:
        """Run the statement once per row; the rows it touched in all
        (as the driver counts them)."""
        params = self.params
        cursor.executemany(self.sql, [params(row) for row in rows])
        return cursor.rowcount


def _identity(row: dict) -> dict:
    return row
