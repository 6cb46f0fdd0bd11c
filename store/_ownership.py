"""Who may drive a store's runs right now: locks held by live salvor processes, never rows.

Two kinds of lock, both released by the kernel or the database the moment
their holder dies (a SIGKILL included), so nothing stale is ever left to
clean up:

* The store locks, two of them: the serve lock, which every ``salvor serve``
  holds shared for its whole life, and the drivers' lock, which a command
  line that drives existing runs (``salvor resume``, ``wake``) holds shared
  while it drives. Each side, once it holds its own, tries the other's
  exclusively without waiting and lets go at once: so any number of daemons
  serve one store together (they share its runs through their owners in the
  store, ``_run_owners``), while a resume beside a daemon is refused before
  it touches anything, and a daemon is refused while such a command drives.
  (Two starting at the very same moment may both be refused; neither ever
  proceeds beside the other.)
* A run lock, one per run, held by whoever drives that run from the command
  line (``salvor run`` takes it before the run exists). A daemon starting
  beside a live ``salvor run`` leaves that run alone instead of recovering
  it a second time.

SQLite: a lock file beside the database (``<db>.lock``): ``flock`` on it is
the serve lock, a POSIX record lock on its byte 0 the drivers' lock, and a
one-byte POSIX record lock at an offset past 0 derived from the run id is a
run lock (flock and record locks do not interact on Linux). A daemon writes
a small JSON (pid, command, listen address, start time) into the file so a
refusal can name it (the last daemon to start; the others are named from
``/proc/locks``, as command lines are). One open file per process: closing
another descriptor of the same file would drop the process's record locks;
and record locks are the process's, so one process is never both a daemon
and a command-line driver of one store.

PostgreSQL: session advisory locks on a dedicated connection, keyed by the
store's schema (``current_schema()``: each schema is its own store), and the
holder named through ``application_name`` in ``pg_stat_activity``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ._engine import create_store_engine, display_url
from ._errors import StoreOwned, StoreUnavailable
from ._file_modes import make_store_directory

SERVE = "serve"
# How long a lock the other side holds only to test it (exclusively, at once released) is
# waited out before taking one's own shared.
_PROBE_GRACE = 1.0
# How long a PostgreSQL lock whose every holder is a dead local process is
# waited for (its backend has not yet seen the connection close).
_DEAD_HOLDER_GRACE = 5.0
# The postgres application_name is cut at 63 bytes by the server.
_APP_NAME_BYTES = 63


@dataclass(frozen=True, slots=True)
class Holder:
    """A live salvor process holding a lock: what a refusal names."""

    pid: int | None
    command: str  # "serve", "run", "resume", ... ("" when unknown)
    listen: str | None = None

    def describe(self) -> str:
        """``salvor serve (pid 4242, http://127.0.0.1:8420)``, as much of it as is known."""
        parts = [f"pid {self.pid}"] if self.pid else []
        if self.listen:
            parts.append(self.listen)
        name = f"salvor {self.command}" if self.command else "another salvor process"
        return f"{name} ({', '.join(parts)})" if parts else name


def _key(*parts: str) -> int:
    """A signed 64-bit key (the range of postgres's bigint advisory locks
    and of a file offset's half)."""
    digest = hashlib.sha256("\0".join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# What a refused command may do instead while a daemon serves the store: a sentence, or one
# made from that daemon (its address says where to send the request).
RunHint = str | Callable[[Holder | None], str]


def _refusal(role: str, holders: list[Holder], run_hint: RunHint) -> StoreOwned:
    serve = next((h for h in holders if h.command == SERVE), None)
    if role == SERVE and serve is not None:
        # Only a daemon of an older salvor holds the serve lock exclusively.
        return StoreOwned(
            f"another {serve.describe()} is serving this store alone (an older salvor); stop "
            "it, or give this one its own store with --store"
        )
    if role == SERVE:
        who = holders[0].describe() if holders else "another salvor command"
        return StoreOwned(
            f"{who} is driving runs in this store; let it finish (or stop "
            "it), then start salvor serve again"
        )
    who = (
        serve.describe()
        if serve is not None
        else (holders[0].describe() if holders else "salvor serve")
    )
    hint = run_hint(serve) if callable(run_hint) else run_hint
    return StoreOwned(f"{who} is serving this store and drives its runs; {hint}, or stop it first")


class StoreLocks:
    """One process's locks on one store. Blocking: call it off the trio thread.

    Error handling: a method that raises leaves the locks this object held
    before it as they were; ``close`` releases all of them.
    """

    def claim(self, role: str, run_hint: RunHint) -> None:
        """Take the store locks as ``role``: ``serve`` shares the store with other daemons and
        with no command-line driver; any other role shares it with other command lines and
        with no daemon.

        Raises:
            StoreOwned: a live salvor on the other side holds the store (named); nothing was
                taken.
        """
        raise NotImplementedError

    def announce(self, listen: str) -> None:
        """Record where the daemon holding the store lock listens, for the next refusal to name."""
        raise NotImplementedError

    def serving(self) -> Holder | None:
        """The live ``salvor serve`` holding the store lock now, if one does; nothing is taken
        (a command that holds no store lock asks, to say what works beside that daemon)."""
        raise NotImplementedError

    def hold_run(self, run_id: str) -> Holder | None:
        """Take ``run_id``'s run lock; returns the holder instead when another process has it."""
        raise NotImplementedError

    def release_run(self, run_id: str) -> None:
        raise NotImplementedError

    def runs_held_elsewhere(self, run_ids: Iterable[str]) -> set[str]:
        """The runs among ``run_ids`` whose run lock another live process holds."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def open_locks(url: str, command: str) -> StoreLocks:
    """The lock handle of the store at ``url`` (normalised) for this process, running ``command``.

    Raises:
        StoreUnavailable: the lock file cannot be opened or the database reached.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _FileLocks(Path(parsed.database or ""), command)
    return _AdvisoryLocks(url, command)


class _FileLocks(StoreLocks):
    def __init__(self, database: Path, command: str) -> None:
        self.path = Path(os.path.realpath(database)).with_name(
            Path(os.path.realpath(database)).name + ".lock"
        )
        self.command = command
        try:
            # Only a command that may create the store gets here with no directory yet.
            make_store_directory(self.path.parent)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot open the store's lock file {self.path} ({exc.strerror or exc})"
            ) from None
        self._inode = os.fstat(self._fd).st_ino

    def claim(self, role: str, run_hint: RunHint) -> None:
        if role == SERVE:
            if not _within_grace(self._share_serving):
                raise _refusal(role, self._holders(), run_hint)
            # Another daemon starting at the same instant tests this lock too (exclusively, for
            # a moment): a command-line driver holds it for its whole life.
            if not _within_grace(self._drivers_free):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                raise _refusal(role, self._drivers(), run_hint)
            self.announce("starting")
            return
        if not _within_grace(self._share_driving):
            # Only a daemon testing the lock holds it so, and lets go at once: not now.
            raise _refusal(role, self._drivers(), run_hint)
        if not _within_grace(self._serving_free):
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)
            raise _refusal(role, self._holders(), run_hint)

    def _share_serving(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _serving_free(self) -> bool:
        """Whether no daemon holds the serve lock (tested exclusively, released at once)."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        return True

    def _share_driving(self) -> bool:
        return _record_lock(self._fd, fcntl.LOCK_SH, 0)

    def _drivers_free(self) -> bool:
        """Whether no command line holds the drivers' lock (tested, released at once)."""
        if not _record_lock(self._fd, fcntl.LOCK_EX, 0):
            return False
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)
        return True

    def _drivers(self) -> list[Holder]:
        pids = _lock_pids(self._inode, "POSIX", 0) - {os.getpid()}
        return [Holder(pid, _command_of(pid)) for pid in sorted(pids)]

    def announce(self, listen: str) -> None:
        record = {
            "pid": os.getpid(),
            "command": self.command,
            "listen": listen,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(record).encode("utf-8"), 0)

    def serving(self) -> Holder | None:
        return next((h for h in self._holders() if h.command == SERVE), None)

    def _holders(self) -> list[Holder]:
        """Who holds the flock: the daemon's own record first, then the pids in /proc/locks."""
        holders: list[Holder] = []
        pids = _lock_pids(self._inode, "FLOCK")
        try:
            record = json.loads(os.pread(self._fd, 4096, 0) or b"null")
        except (OSError, ValueError):
            record = None
        if isinstance(record, dict) and record.get("pid") in pids:
            holders.append(
                Holder(record["pid"], str(record.get("command", "")), record.get("listen"))
            )
        for pid in sorted(pids - {h.pid for h in holders} - {os.getpid()}):
            holders.append(Holder(pid, _command_of(pid)))
        return holders

    @staticmethod
    def _offset(run_id: str) -> int:
        # Past byte 0 and inside a positive off_t.
        return 1 + (_key("run", run_id) & ((1 << 62) - 1))

    def hold_run(self, run_id: str) -> Holder | None:
        if not _record_lock(self._fd, fcntl.LOCK_EX, self._offset(run_id)):
            pids = _lock_pids(self._inode, "POSIX", self._offset(run_id)) - {os.getpid()}
            pid = min(pids) if pids else None
            return Holder(pid, _command_of(pid) if pid else "")
        return None

    def release_run(self, run_id: str) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._offset(run_id))

    def runs_held_elsewhere(self, run_ids: Iterable[str]) -> set[str]:
        held = set()
        for run_id in run_ids:
            offset = self._offset(run_id)
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, offset)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                held.add(run_id)
                continue
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, offset)
        return held

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _record_lock(fd: int, mode: int, offset: int) -> bool:
    """Take a one-byte POSIX record lock at ``offset`` without waiting; False when another
    process holds it in a conflicting mode."""
    try:
        fcntl.lockf(fd, mode | fcntl.LOCK_NB, 1, offset)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def _within_grace(take: Callable[[], bool]) -> bool:
    """``take()`` until it succeeds, for ``_PROBE_GRACE`` seconds at most: the other side
    tests the lock this takes by holding it exclusively for a moment."""
    deadline = time.monotonic() + _PROBE_GRACE
    while not take():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _lock_pids(inode: int, kind: str, start: int | None = None) -> set[int]:
    """Pids holding a ``kind`` (FLOCK, POSIX) lock on the file with ``inode``
    (at ``start``); Linux only."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return set()
    pids = set()
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:123456 0 EOF"; a blocked waiter's
        # line reads "1: -> FLOCK ..." and is not a holder.
        fields = line.split()
        if len(fields) < 8 or fields[1] != kind or not fields[4].isdigit():
            continue
        if fields[5].rsplit(":", 1)[-1] != str(inode):
            continue
        if start is None or fields[6] == str(start):
            pids.add(int(fields[4]))
    return pids


def _command_of(pid: int) -> str:
    """The salvor command a process runs (``resume``), read from its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return ""
    for before, word in pairwise(argv):
        if before.endswith(("salvor", "salvor.daemon.cli")) and word and not word.startswith("-"):
            return word
    return ""


def _dead(pid: int | None) -> bool:
    """Whether ``pid`` names no process on this machine (None: unknown, so not provably dead)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class _AdvisoryLocks(StoreLocks):
    def __init__(self, url: str, command: str) -> None:
        self.command = command
        self._engine = create_store_engine(url)
        try:
            self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            self._schema = (
                self._conn.execute(text("SELECT current_schema()")).scalar_one() or "public"
            )
        except SQLAlchemyError as exc:
            self._engine.dispose()
            raise StoreUnavailable(
                f"cannot reach the store at {display_url(url)} to "
                f"lock it ({exc.__class__.__name__})"
            ) from None
        # The serve lock keeps the key the store lock always had: a daemon of an older salvor
        # holding it exclusively still refuses (and is refused by) this one.
        self._store_key = _key("store", self._schema)
        self._drivers_key = _key("drivers", self._schema)
        self._runs: dict[str, int] = {}
        self._name(f"salvor {command} {os.getpid()}")

    def _name(self, value: str) -> None:
        value = value.encode("utf-8")[:_APP_NAME_BYTES].decode("utf-8", "ignore")
        self._conn.execute(text("SELECT set_config('application_name', :v, false)"), {"v": value})

    def _try(self, key: int, *, shared: bool = False) -> bool:
        fn = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
        return bool(self._conn.execute(text(f"SELECT {fn}(:k)"), {"k": key}).scalar_one())

    def _holders(self, key: int) -> list[Holder]:
        rows = self._conn.execute(
            text(
                "SELECT a.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid "
                "= l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND l.classid::bigint = :hi AND l.objid::bigint = "
                ":lo AND a.pid <> pg_backend_pid()"
            ),
            {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF},
        ).all()
        holders = []
        for backend_pid, name in rows:
            # "salvor serve 4242 http://127.0.0.1:8420", as _name set it.
            words = (name or "").split(" ", 3)
            if len(words) >= 3 and words[0] == "salvor" and words[2].isdigit():
                holders.append(
                    Holder(int(words[2]), words[1], words[3] if len(words) > 3 else None)
                )
            else:
                holders.append(Holder(None, "", f"a database session, backend pid {backend_pid}"))
        return holders

    def claim(self, role: str, run_hint: RunHint) -> None:
        mine, theirs = (
            (self._store_key, self._drivers_key)
            if role == SERVE
            else (self._drivers_key, self._store_key)
        )
        self._take(mine, role, run_hint, shared=True)
        try:
            self._take(theirs, role, run_hint, shared=False)
        except StoreOwned:
            self._conn.execute(text("SELECT pg_advisory_unlock_shared(:k)"), {"k": mine})
            raise
        # Only tested: the other side may come once this one has gone.
        self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": theirs})
        if role == SERVE:
            self.announce("starting")

    def _take(self, key: int, role: str, run_hint: RunHint, *, shared: bool) -> None:
        deadline = time.monotonic() + _DEAD_HOLDER_GRACE
        probe_deadline = time.monotonic() + _PROBE_GRACE
        while not self._try(key, shared=shared):
            holders = self._holders(key)
            # A salvor SIGKILLed a moment ago still holds the lock until its
            # backend notices the closed connection: wait for that, briefly.
            dying = holders and all(_dead(h.pid) for h in holders)
            # Taking one's own side shared fails only while the other side tests it; testing the
            # other side fails too while a peer of one's own side tests it at the same instant
            # (three daemons started together): a real holder outlasts the grace.
            probed = time.monotonic() < probe_deadline
            if not (dying or probed) or time.monotonic() > deadline:
                raise _refusal(role, holders, run_hint)
            time.sleep(0.05 if dying else 0.01)

    def announce(self, listen: str) -> None:
        self._name(f"salvor {self.command} {os.getpid()} {listen}")

    def serving(self) -> Holder | None:
        return next((h for h in self._holders(self._store_key) if h.command == SERVE), None)

    def hold_run(self, run_id: str) -> Holder | None:
        key = _key("run", self._schema, run_id)
        if not self._try(key):
            holders = self._holders(key)
            return holders[0] if holders else Holder(None, "")
        self._runs[run_id] = key
        return None

    def release_run(self, run_id: str) -> None:
        key = self._runs.pop(run_id, None)
        if key is not None:
            self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})

    def runs_held_elsewhere(self, run_ids: Iterable[str]) -> set[str]:
        # One read of pg_locks, not a round trip per run: recovery may ask about thousands.
        rows = self._conn.execute(
            text(
                "SELECT classid::bigint, objid::bigint FROM pg_locks WHERE locktype = "
                "'advisory' AND granted AND objsubid = 1 AND pid <> pg_backend_pid() "
                "AND database = (SELECT oid FROM pg_database "
                "WHERE datname = current_database())"
            )
        )
        # Each row as a plain pair (SQLAlchemy 2.1 deprecates ``Result.tuples()``).
        taken = {(classid, objid) for classid, objid in rows}
        held = set()
        for run_id in run_ids:
            key = _key("run", self._schema, run_id)
            if ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF) in taken:
                held.add(run_id)
        return held

    def close(self) -> None:
        try:
            try:
                # Released now: left to the connection's end, they last until the server has
                # noticed it closed, and a taker in this same process (a daemon started again)
                # finds them held by a live pid, its own.
                self._conn.execute(text("SELECT pg_advisory_unlock_all()"))
            except SQLAlchemyError:
                pass  # the connection is already gone, and its locks with its session
            self._conn.close()
        finally:
            self._engine.dispose()
