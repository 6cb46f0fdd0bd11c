"""What every repository of the store shares: its engine, the reading and writing transactions,
and how a database failure becomes ``StoreUnavailable``.

A repository serves one table family (``store.outbox``, ``store.client_leases``, ...) and is
built by ``EventStore.open`` from the store's engine. Its methods are synchronous and safe to
call from any thread; the daemon calls them from threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from ._engine import READ_OPTION, display_url
from ._errors import StoreUnavailable, passes_by_itself


def failure_reason(exc: BaseException) -> str:
    """The first line of a driver error, without SQLAlchemy's statement dump."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(inner).strip().splitlines()
    return lines[0].strip() if lines else type(inner).__name__


class Repository:
    """One table family's access over the store's engine."""

    def __init__(self, engine: Engine, url: str) -> None:
        self._engine = engine
        self._reader = engine.execution_options(**{READ_OPTION: True})
        self.url = display_url(url)
        self.dialect = engine.dialect.name

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
            raise StoreUnavailable(
                f"the store at {self.url} failed to {doing}: {failure_reason(exc)}",
                transient=passes_by_itself(exc),
            ) from None

    @contextmanager
    def _writing(self, doing: str) -> Iterator[Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite: it takes the write lock first).

        Raises:
            StoreUnavailable: the database failed (``doing`` says what was being written);
                the transaction was rolled back, nothing of it was written.
        """
        try:
            with self._engine.begin() as connection:
                yield connection
        except SQLAlchemyError as exc:
            if self.dialect == "sqlite" and passes_by_itself(exc):
                # A connection SQLite opened while the file was unwritable stays read-only:
                # open them all afresh (as the event store does after such a failure).
                self._engine.dispose()
            raise StoreUnavailable(
                f"the store at {self.url} failed to {doing}: {failure_reason(exc)}",
                transient=passes_by_itself(exc),
            ) from None
