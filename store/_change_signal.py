"""How a process learns that another one committed to the same store: a notice per append
transaction on PostgreSQL, a changed ``data_version`` on SQLite.

PostgreSQL: every append transaction sends ``pg_notify`` on the store's channel, naming the
store handle that committed it and each run it appended with the first and last seq of its new
events, and carrying those events when they are small (most are: a listener then hands them on
without reading the store). The server delivers a notice only
once its transaction commits (never for one rolled back), to every session listening then; a
``ChangeListener`` is one such session. The channel is derived from the store's schema
(``current_schema()``, as the store's locks are), so two stores in one database never hear
each other. A payload holds as many runs as fit under the server's 8,000-byte limit; a
transaction naming more sends several.

SQLite: ``PRAGMA data_version`` read on a connection of its own changes whenever any other
connection (of this process or another) committed; ``DataVersionWatch`` reads it, and
``ChangeSignal.event_counts`` then says in one query how far each run of interest has got.

Nothing here waits on trio or knows of subscribers: the daemon's change feed
(``salvor.daemon.runs._change_feed``) drives these from its own thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from salvor.protocol import encode_envelope
from sqlalchemy import Engine, bindparam, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ._append_rows import Prepared
from ._engine import CONNECT_TIMEOUT_SECONDS, display_url
from ._errors import StoreUnavailable, passes_by_itself
from ._repository import Repository
from ._schema import runs

# PostgreSQL refuses a payload of 8,000 bytes or more; what a notice carries stays below.
NOTICE_LIMIT_BYTES = 7900
# A run's new events travel inside its notice when their stored payloads come to at most this
# many bytes together (and the notice still fits); otherwise a listener reads them.
INLINE_EVENT_BYTES = 2048
# A notice's body that names no run: any run may have moved (a run id too long for any payload,
# or a payload a listener cannot read). A listener then reads every run it follows.
ANY_RUN = "*"
# The application_name of a listener's session, followed by the process id (what
# ``pg_stat_activity`` shows an operator, and what a test finds it by).
LISTENER_NAME = "salvor changes"
# Run ids per ``event_counts`` statement (SQLite's bound on parameters is 32,766; PostgreSQL's
# is higher): a process may follow many runs.
_COUNTS_CHUNK = 500
_SELECT_COUNTS = select(runs.c.run_id, runs.c.event_count).where(
    runs.c.run_id.in_(bindparam("run_ids", expanding=True))
)


# The runs a run list must be told of when they move (SQLite, ``ChangeSignal.listed``):
# those that started lately (ix_runs_listing), those in the states a drive passes through or
# parks in that have an index of their own, and those the caller names.
_LIVE_STATES = "state IN ('running', 'awaiting_model', 'awaiting_tool')"
_LISTED = "SELECT run_id, event_count, state, last_recorded_at FROM runs WHERE "
_LISTED_SINCE = text(
    f"{_LISTED} first_recorded_at >= :since UNION {_LISTED} {_LIVE_STATES} "
    f"UNION {_LISTED} state = 'sleeping' UNION {_LISTED} state = 'needs_reconciliation'"
)
_LISTED_NAMED = text(f"{_LISTED} run_id IN :run_ids").bindparams(
    bindparam("run_ids", expanding=True)
)
# Runs resting where no index finds them (read once, when a run list starts being watched).
_LISTED_RESTING = text(f"{_LISTED} state IN ('suspended', 'budget_exceeded')")


@dataclass(frozen=True, slots=True)
class ListedRun:
    """What a run list's watch reads of a run (``ChangeSignal.listed``)."""

    event_count: int
    state: str
    last_recorded_at: str


def change_channel(schema: str) -> str:
    """The notice channel of the store in ``schema``: a plain lower-case identifier, the same in
    every salvor process, distinct per schema."""
    return "salvor_changes_" + hashlib.sha256(schema.encode("utf-8")).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class ChangeNotice:
    """What one notice says: which store handle committed (``origin``), each run it appended
    with the first and last seq of its new events (None: any run may have moved), and for the
    runs whose new events were small, those events themselves (wire JSON, parsed)."""

    origin: str
    runs: dict[str, tuple[int, int]] | None
    envelopes: dict[str, list[Any]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Each run's event count in the store after the commit."""
        return {run_id: last + 1 for run_id, (_, last) in (self.runs or {}).items()}


def notice_item(run_id: str, first: int, last: int, encoded: Sequence[str] = ()) -> str:
    """One run of a notice: ``[run_id, first, last]``, or with the new events' wire JSON
    (``encode_envelope``) as a fourth element, spliced in as it is (no second escaping)."""
    head = json.dumps([run_id, first, last], separators=(",", ":"))
    if not encoded:
        return head
    return head[:-1] + ",[" + ",".join(encoded) + "]]"


def notice_payloads(origin: str, items: Iterable[tuple[str, str]]) -> list[str]:
    """The payloads that carry each ``(item, bare)`` of ``origin``'s commit (``notice_item``;
    ``bare`` is the item without its events, used when the item does not fit a payload):
    ``"<origin> <JSON list of items>"``, each under ``NOTICE_LIMIT_BYTES`` of UTF-8;
    ``"<origin> *"`` (``ANY_RUN``) for a run id no payload could hold."""
    head = origin + " "
    payloads: list[str] = []
    chosen: list[str] = []
    size = len(head) + 2
    for item, bare in items:
        weight = len(item.encode("utf-8"))
        if len(head) + weight + 2 > NOTICE_LIMIT_BYTES:
            item, weight = bare, len(bare.encode("utf-8"))
        if len(head) + weight + 2 > NOTICE_LIMIT_BYTES:
            payloads.append(head + ANY_RUN)
            continue
        if chosen and size + 1 + weight > NOTICE_LIMIT_BYTES:
            payloads.append(head + "[" + ",".join(chosen) + "]")
            chosen, size = [], len(head) + 2
        size += weight + (1 if chosen else 0)
        chosen.append(item)
    if chosen:
        payloads.append(head + "[" + ",".join(chosen) + "]")
    return payloads


def parse_notice(payload: str) -> ChangeNotice:
    """A payload as ``ChangeNotice``; one this build cannot read says any run may have moved."""
    origin, _, body = payload.partition(" ")
    if body == ANY_RUN:
        return ChangeNotice(origin, None)
    runs: dict[str, tuple[int, int]] = {}
    envelopes: dict[str, list[Any]] = {}
    try:
        for item in json.loads(body):
            run_id, first, last = str(item[0]), int(item[1]), int(item[2])
            runs[run_id] = (first, last)
            if len(item) > 3 and isinstance(item[3], list):
                envelopes[run_id] = item[3]
    except (ValueError, TypeError, IndexError, KeyError):
        return ChangeNotice(origin, None)
    return ChangeNotice(origin, runs, envelopes)


class ChangeSignal(Repository):
    """The store's side of telling other processes what it committed (``store.changes``).

    Safe to share between threads: ``announce`` runs under the store's write lock, the reads on
    the store's pooled reader connections.
    """

    def __init__(self, engine: Engine, url: str) -> None:
        super().__init__(engine, url)
        # As given, not its display form: a listener connects with it.
        self._url = url
        # The notice channel, learnt from the writer's session on its first append.
        self._channel: str | None = None
        # What this handle's notices say they come from: its own listeners skip them (the
        # process that committed hears of its commits at once, from its own writer).
        self.origin = secrets.token_hex(6)

    def announce(self, cursor: Any, batch: Sequence[Prepared]) -> None:
        """Inside an append transaction (PostgreSQL; nothing on SQLite): queue the notices that
        name each run of ``batch`` and the first and last seq of its new events (and the events
        themselves, when they are small), sent by the server at commit.

        Raises:
            The driver's error: the transaction fails as any of its statements would.
        """
        if self.dialect != "postgresql":
            return
        if self._channel is None:
            cursor.execute("SELECT current_schema()")
            self._channel = change_channel(cursor.fetchone()[0] or "public")
        items = []
        for prepared in batch:
            span = (prepared.run_id, prepared.envelopes[0].seq, prepared.envelopes[-1].seq)
            bare = notice_item(*span)
            # Small events travel with the notice: a listener hands them over without a read.
            small = sum(len(row["payload"]) for row in prepared.event_rows) <= INLINE_EVENT_BYTES
            encoded = [encode_envelope(e) for e in prepared.envelopes] if small else ()
            items.append((notice_item(*span, encoded), bare))
        for payload in notice_payloads(self.origin, items):
            cursor.execute("SELECT pg_notify(%s, %s)", (self._channel, payload))

    def event_counts(self, run_ids: Collection[str]) -> dict[str, int]:
        """How many events each of ``run_ids`` has in the store (a run with none is left out).

        Raises:
            StoreUnavailable: the database failed.
        """
        counts: dict[str, int] = {}
        ids = list(run_ids)
        try:
            with self._reader.connect() as connection:
                for start in range(0, len(ids), _COUNTS_CHUNK):
                    chunk = ids[start : start + _COUNTS_CHUNK]
                    for run_id, count in connection.execute(_SELECT_COUNTS, {"run_ids": chunk}):
                        counts[run_id] = int(count)
        except SQLAlchemyError as exc:
            raise StoreUnavailable(
                f"the store at {self.url} could not say which runs moved: {type(exc).__name__}",
                transient=passes_by_itself(exc),
            ) from None
        return counts

    def listed(
        self, since: str, named: Collection[str], *, resting: bool = False
    ) -> dict[str, ListedRun]:
        """Each run a run list may have to be told of, by id: those
        first recorded at or after ``since`` (an instant in the store's form), those running,
        awaiting a call, sleeping or needing reconciliation, and those of ``named`` (the runs
        the caller saw at rest short of an end). ``resting``: also every suspended run and
        every one over its budget (a full read: once, when the caller starts). On SQLite, where
        no notice says which runs moved.

        Raises:
            StoreUnavailable: the database failed.
        """
        ids = list(named)
        try:
            with self._reader.connect() as connection:
                rows = list(connection.execute(_LISTED_SINCE, {"since": since}))
                if resting:
                    rows += connection.execute(_LISTED_RESTING)
                for start in range(0, len(ids), _COUNTS_CHUNK):
                    chunk = ids[start : start + _COUNTS_CHUNK]
                    rows += connection.execute(_LISTED_NAMED, {"run_ids": chunk})
        except SQLAlchemyError as exc:
            raise StoreUnavailable(
                f"the store at {display_url(self._url)} could not say which runs moved: "
                f"{type(exc).__name__}",
                transient=passes_by_itself(exc),
            ) from None
        return {run_id: ListedRun(int(count), state, at) for run_id, count, state, at in rows}

    def listener(self) -> ChangeListener:
        """A listener on this store's channel, not yet connected (PostgreSQL only)."""
        if self.dialect != "postgresql":
            raise ValueError("only a PostgreSQL store sends notices; SQLite's is DataVersionWatch")
        return ChangeListener(self._url, skip_origin=self.origin)

    def data_version_watch(self) -> DataVersionWatch:
        """A watch of this store's ``data_version`` on a connection of its own (SQLite only).

        Raises:
            StoreUnavailable: no connection could be opened.
        """
        if self.dialect != "sqlite":
            raise ValueError("only a SQLite store has a data_version; PostgreSQL's is a listener")
        return DataVersionWatch(self._engine, self._url)


class ChangeListener:
    """One PostgreSQL session LISTENing on a store's channel. Used by one thread at a time."""

    def __init__(self, url: str, *, skip_origin: str | None = None) -> None:
        self._skip_origin = skip_origin
        self._conninfo = (
            make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        self._url = url
        self._connection: Any = None

    def open(self) -> None:
        """Connect and LISTEN; every notice committed from now on reaches ``notices``.

        Raises:
            StoreUnavailable: the database cannot be reached; nothing is held.
        """
        import psycopg
        from psycopg import sql

        try:
            connection = psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                application_name=f"{LISTENER_NAME} {os.getpid()}",
            )
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot reach the store at {display_url(self._url)} to listen for changes: "
                f"{_first_line(exc)}",
                transient=True,
            ) from None
        try:
            schema = connection.execute("SELECT current_schema()").fetchone()[0] or "public"
            connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(change_channel(schema))))
        except psycopg.Error as exc:
            connection.close()
            raise StoreUnavailable(
                f"cannot listen for changes to the store at {display_url(self._url)}: "
                f"{_first_line(exc)}",
                transient=True,
            ) from None
        self._connection = connection

    def notices(self, timeout: float) -> Iterator[ChangeNotice]:
        """The notices that arrive within ``timeout`` seconds, as they arrive, but those of the
        store handle this listener was made by (its process published them at commit).

        Raises:
            StoreUnavailable: the session was lost (a listener must be opened again; notices
                sent meanwhile are lost to it).
        """
        import psycopg

        try:
            for notify in self._connection.notifies(timeout=timeout):
                notice = parse_notice(notify.payload)
                if notice.origin != self._skip_origin:
                    yield notice
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"lost the session listening for changes to the store at "
                f"{display_url(self._url)}: {_first_line(exc)}",
                transient=True,
            ) from None

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            finally:
                self._connection = None


class DataVersionWatch:
    """``PRAGMA data_version`` on a SQLite connection of its own. Used by one thread at a time."""

    def __init__(self, engine: Engine, url: str) -> None:
        try:
            self._connection = engine.raw_connection()
            # Its own for as long as it watches: the pool's readers never get it.
            self._connection.detach()
            self._last = self._version()
        except SQLAlchemyError as exc:
            raise StoreUnavailable(
                f"cannot watch the store at {display_url(url)} for changes: {type(exc).__name__}"
            ) from None

    def _version(self) -> int:
        cursor = self._connection.cursor()
        try:
            cursor.execute("PRAGMA data_version")
            return int(cursor.fetchone()[0])
        finally:
            cursor.close()

    def changed(self) -> bool:
        """Whether another connection committed since the last call (or since opening).

        Raises:
            The driver's error: the connection failed (a watch must be opened again).
        """
        version = self._version()
        changed, self._last = version != self._last, version
        return changed

    def close(self) -> None:
        self._connection.close()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else type(exc).__name__
