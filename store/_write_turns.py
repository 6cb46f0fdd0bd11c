"""Taking turns at a SQLite store's write lock: a kernel lock beside the database, held around
each write transaction of this process and of every other salvor process on the store.

SQLite's own write lock does not queue its waiters. A connection that finds it taken sleeps in
its busy handler (1, 2, 5, 10, ... up to 100 ms a try) and tries again, whether or not the lock
was let go meanwhile; a process that commits back to back can take it again before a sleeper
wakes. Between the workers of ``salvor serve --workers N`` (each with its own group-commit
writer, its own claims and lease renewals), that left each writer asleep for milliseconds while
the lock was free, and once in a while starved one for a second. So every write transaction
first waits for its turn on ``flock(LOCK_EX)`` over ``<db>.write-turn``, in the thread that
writes: the kernel wakes the next waiter the moment the holder lets go, and SQLite's lock is
then free at its ``BEGIN IMMEDIATE``.

Rules of this module:

* The turn is taken before ``BEGIN IMMEDIATE`` and let go after ``COMMIT`` (or the rollback),
  never the other way round: no holder of SQLite's lock ever waits for a turn, so the two locks
  cannot wait on each other.
* Each turn opens the file afresh and closes it after: ``flock`` belongs to an open file, so two
  threads of one process exclude each other as two processes do, and the store needs nothing
  closed when it is. (``<db>.lock``, the store locks of ``_ownership``, is another file: closing
  a descriptor of that one would drop its record locks.) The lock is let go explicitly before
  the close, so a child forked meanwhile (its copy of the descriptor closed at its exec) does
  not hold it on.
* A thread already holding the turn of a file passes straight through a nested one.
* The kernel lets go of a holder's turn when it dies, SIGKILL included: nothing stale is left.
  A holder stopped (SIGSTOP) inside its transaction holds the others up until it continues, as
  SQLite's own lock would; they wait for their turn instead of failing at the busy timeout.
* The turn orders writers, it guards nothing: when the file cannot be opened or locked (another
  user's store, a read-only directory), a write goes ahead without it and SQLite's lock, still
  the one that guards the database, decides with its busy handler. A writer that takes no turns
  (an older salvor, the ``sqlite3`` shell) is waited for the same way.
* PostgreSQL queues its lock waiters itself: a store there takes no turns.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine

from ._file_modes import FILE_MODE, TURN_SUFFIX

# The turn files the current thread holds (a nested write passes through).
_held = threading.local()


class WriteTurns:
    """The turns at one store's write lock; ``None`` for ``path``: a store that takes none."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    @contextmanager
    def taken(self) -> Iterator[None]:
        """Wait for this thread's turn, for the block (blocking: never on the trio thread).

        Nothing here raises: without a turn to take, the block runs without one.
        """
        held: set[Path] = _held.__dict__.setdefault("paths", set())
        if self.path is None or self.path in held:
            yield
            return
        fd = _locked(self.path)
        if fd is None:
            yield
            return
        held.add(self.path)
        try:
            yield
        finally:
            held.discard(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


def _locked(path: Path) -> int | None:
    """A descriptor of ``path`` holding ``LOCK_EX`` (waited for), or None when it cannot be had."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def write_turns(engine: Engine) -> WriteTurns:
    """The turns of the store ``engine`` opens: beside its file on SQLite, none elsewhere."""
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:":
        return WriteTurns(None)
    # The file's real path, as the store locks' (``_ownership``): two processes naming the store
    # through different links take turns on one file.
    return WriteTurns(Path(os.path.realpath(database) + TURN_SUFFIX))
