"""What every repository of the store shares: its engines, the reading and writing transactions,
and how a database failure becomes ``StoreUnavailable``.

A repository serves one table family (``store.owners``, ``store.definitions``, ``store.outbox``,
...) and is built by ``EventStore.open`` over the store's engine. Its methods are synchronous and
safe to call from any thread; the daemon calls them from threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from ._engine import READ_OPTION, display_url
from ._errors import StoreUnavailable, passes_by_itself
from ._write_turns import write_turns


def failure_reason(exc: BaseException) -> str:
    """The first line of a driver error, without SQLAlchemy's statement dump."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(inner).strip().splitlines()
    return lines[0].strip() if lines else type(inner).__name__


class Repository:
    """One table family's access over the store's engine: the base of every repository."""

    def __init__(self, engine: Engine, url: str) -> None:
        """``url``: the store's URL, in any form (error messages show its display form)."""
        # Writes: a transaction of the pool's (``BEGIN IMMEDIATE`` on SQLite, see _engine).
        self._engine = engine
        # Reads begin a deferred transaction on SQLite, never queueing behind the write lock.
        self._reader = engine.execution_options(**{READ_OPTION: True})
        # Every write waits for its turn at SQLite's write lock (``_write_turns``).
        self._turns = write_turns(engine)
        self.url = display_url(url)
        self.dialect = engine.dialect.name

    def _failed(self, exc: BaseException, doing: str) -> StoreUnavailable:
        """The error a database failure while ``doing`` something raises (``transient`` when it
        may pass by itself). Raise it ``from None``: the driver's dump stays out of it."""
        return StoreUnavailable(
            f"the store at {self.url} failed to {doing}: {failure_reason(exc)}",
            transient=passes_by_itself(exc),
        )

    def _forget_connections_after(self, exc: BaseException) -> None:
        """After a write that may pass by itself failed on SQLite, open every connection afresh.

        SQLite opens a file it cannot write read-only, silently: a pooled connection opened
        while the file was unwritable would refuse writes forever after the file is writable
        again. Readers holding one keep it until they return it; it is closed then.
        """
        if self.dialect == "sqlite" and passes_by_itself(exc):
            self._engine.dispose()

    @contextmanager
    def _reading(self, doing: str) -> Iterator[Connection]:
        """A read transaction (deferred on SQLite: it never waits for the write lock).

        Raises:
            StoreUnavailable: the database failed (``doing`` says what was being read).
        """
        try:
            with self._reader.connect() as connection:
                yield connection
        except SQLAlchemyError as exc:
            raise self._failed(exc, doing) from None

    @contextmanager
    def _writing(self, doing: str) -> Iterator[Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite: it takes the write lock first, in
        its turn). Blocking: waits for the turn and the lock.

        Raises:
            StoreUnavailable: the database failed (``doing`` says what was being written);
                the transaction was rolled back, nothing of it was written.
        """
        try:
            with self._turns.taken(), self._engine.begin() as connection:
                yield connection
        except SQLAlchemyError as exc:
            self._forget_connections_after(exc)
            raise self._failed(exc, doing) from None

    def _upsert(self, table: Any, row: dict, keys: tuple[str, ...], doing: str) -> None:
        """Insert ``row`` into ``table``, or replace the other columns of the row its ``keys``
        name, in one transaction of its own (this dialect's ``ON CONFLICT DO UPDATE``).

        Raises:
            StoreUnavailable: the database failed; ``doing`` says what was being done, and the
                row is as it was.
        """
        if self.dialect == "sqlite":
            insert = sqlite_insert
        else:
            # Loaded already by a PostgreSQL engine; a SQLite store's process never needs it.
            from sqlalchemy.dialects.postgresql import insert
        statement = (
            insert(table)
            .values(row)
            .on_conflict_do_update(
                index_elements=[table.c[key] for key in keys],
                set_={k: v for k, v in row.items() if k not in keys},
            )
        )
        with self._writing(doing) as connection:
            connection.execute(statement)
