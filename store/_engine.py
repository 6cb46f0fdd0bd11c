"""Turning a store URL into a SQLAlchemy engine, with SQLite hardened once.

SQLite is set up in a connect hook, the documented pysqlite recipe: the
driver's own transaction handling is switched off (``isolation_level =
None``) and the engine's ``begin`` event emits ``BEGIN IMMEDIATE``, so a
writer takes the write lock when its transaction starts instead of failing
with ``SQLITE_BUSY`` halfway through it. Reads go through an engine view
marked ``salvor_read`` and begin a deferred transaction, so they never queue
behind the write lock.

PostgreSQL ends a session of ours left idle inside a transaction for longer than
``IDLE_IN_TRANSACTION_SECONDS`` (set once per connection, in a connect hook). A
process stopped between two statements (SIGSTOP, a frozen VM) keeps its row locks
until its server session ends; a node paused inside its lease renewal would
otherwise hold the row every takeover of its runs must write, and its peers would
wait for it to wake instead of taking its runs once its lease lapsed.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ._errors import StoreUnavailable
from ._file_modes import create_database_file, make_store_directory

SYNCHRONOUS_MODES = ("FULL", "NORMAL", "OFF")
BUSY_TIMEOUT_MS = 5000
CONNECT_TIMEOUT_SECONDS = 5
# Longer than any gap between two statements of one of salvor's transactions (a few statements
# each, nothing awaited between them; an upgrade decodes a page of views in milliseconds), and
# shorter than the default lease less a heartbeat (6 s less 1 s): a node stopped inside a
# transaction has it ended before its lease lapses in the store, so its peers' takeover does not
# wait for it. Under a shorter lease the takeover waits at most the difference.
IDLE_IN_TRANSACTION_SECONDS = 4
READ_OPTION = "salvor_read"


def display_url(url: str) -> str:
    """The URL with any password masked, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return url


def create_store_engine(url: str, *, synchronous: str = "FULL") -> Engine:
    """An engine for ``url`` (already normalised), not yet connected.

    Raises:
        StoreUnavailable: the URL does not parse, names an in-memory SQLite
            database, or the SQLite file's directory cannot be created.
        ValueError: ``synchronous`` is not FULL, NORMAL or OFF.
    """
    mode = synchronous.upper()
    if mode not in SYNCHRONOUS_MODES:
        raise ValueError(
            f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, not {synchronous!r}"
        )
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise StoreUnavailable(f"the store URL {url!r} does not parse ({exc})") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url, parsed.database, mode)
    if backend == "postgresql":
        connect_args = {}
        if "connect_timeout" not in parsed.query:
            connect_args["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
        # pre-ping lets a long-lived daemon ride out a database restart.
        engine = create_engine(parsed, connect_args=connect_args, pool_pre_ping=True)
        event.listen(engine, "connect", _bound_idle_transactions)
        return engine
    raise StoreUnavailable(
        f"the store URL {display_url(url)} names a {backend} database; salvor stores "
        "runs in SQLite or PostgreSQL"
    )


def _bound_idle_transactions(dbapi_connection, _record) -> None:
    """Have PostgreSQL end this session once it sits idle inside a transaction for longer than
    ``IDLE_IN_TRANSACTION_SECONDS``, unless the role or database sets a limit of its own.

    A session it ends has its transaction rolled back (nothing of it was written) and its
    holder's next statement fails, as after a database restart."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false) "
            "WHERE current_setting('idle_in_transaction_session_timeout') = '0'",
            (f"{IDLE_IN_TRANSACTION_SECONDS * 1000}",),
        )
    finally:
        cursor.close()
    # The query opened a transaction (the driver's default); the setting is the session's and
    # outlives it.
    dbapi_connection.commit()


def _check_writable(path: Path) -> None:
    """Refuse a store SQLite could open but not write: its ``-shm`` is memory-mapped, and a
    write to a mapping of a file it may not write kills the process with SIGBUS, not an error.

    Root passes the mode bits but not an immutable file (``chattr +i``); ``os.access``
    answers for both.
    """
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise StoreUnavailable(
            f"the store directory {path.parent} is not writable by this user; SQLite keeps its "
            "-wal and -shm files there, so fix its permissions or give another store with --store"
        )
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if file.exists() and not os.access(file, os.R_OK | os.W_OK):
            raise StoreUnavailable(
                f"the store file {file} is not writable by this user (or is immutable); "
                "fix its permissions or give another store with --store"
            )


def _sqlite_engine(url: str, database: str | None, synchronous: str) -> Engine:
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        raise StoreUnavailable(
            f"the store URL {url} names an in-memory SQLite database, which would lose "
            "every run at exit; give a file path"
        )
    path = Path(database)
    try:
        make_store_directory(path.parent)
    except OSError as exc:
        raise StoreUnavailable(
            f"cannot create the store directory {path.parent} ({exc.strerror or exc})"
        ) from None
    _check_writable(path)
    try:
        # 0600 from its first byte: SQLite gives its -wal, -shm and -journal the same mode.
        create_database_file(path)
    except OSError as exc:
        raise StoreUnavailable(
            f"cannot create the store file {path} ({exc.strerror or exc})"
        ) from None
    engine = create_engine(url)
    pragmas = (
        f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
        "PRAGMA journal_mode = WAL",
        f"PRAGMA synchronous = {synchronous}",
        "PRAGMA foreign_keys = OFF",
    )

    @event.listens_for(engine, "connect")
    def _harden(dbapi_connection, _record) -> None:
        # Take transaction control away from the driver; "begin" below owns it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            for pragma in pragmas:
                cursor.execute(pragma)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection) -> None:
        if connection.get_execution_options().get(READ_OPTION):
            connection.exec_driver_sql("BEGIN")
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
