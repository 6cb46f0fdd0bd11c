"""The event store: append-only run logs with their materialised folds.

Rules of this module:

* An append is one transaction: the batch's events, the run's ``runs`` row
  (the fold after the batch), any idempotency claim change and the outbox
  row the batch calls for (a store opened with notifications on) commit
  together or not at all. A refused, conflicting or failed append leaves the
  store exactly as it was.
* The guard runs before the transaction: nothing the pure core refuses is
  ever offered to the database, and no lock is held while it decides.
* ``recorded_at`` is this store's clock, read once per batch.
* Reads never fail a whole listing for one run's bad row: the failure is
  scoped to that run's entry.
* Statements are built once at import time and reused. The append path's
  (``_append_rows``) reads nothing, but to settle a claim it did not find.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from salvor.protocol import (
    Envelope,
    Event,
    GuardRefusal,
    MalformedEvent,
    RunState,
    RunView,
    decode_event,
    fold,
    format_instant,
)
from sqlalchemy import (
    Connection,
    Engine,
    LargeBinary,
    bindparam,
    cast,
    func,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from ._append_rows import (
    IdentityTaken,
    Prepared,
    Writes,
    append_group,
    append_txn,
    prepare,
    stale_fences,
)
from ._change_signal import ChangeSignal
from ._claims import Claims
from ._client_leases import ClientLeases
from ._definitions import Definitions
from ._engine import READ_OPTION, create_store_engine, display_url
from ._errors import (
    CorruptLog,
    Fenced,
    StoreError,
    StoreUnavailable,
    passes_by_itself,
)
from ._location import normalize_store_url
from ._outbox import Outbox
from ._quota import RunQuota, bytes_after
from ._records import (
    ParkedWrite,
    RunSummary,
    decode_cursor,
    encode_cursor,
    encode_position,
    summary_from_row,
)
from ._repository import failure_reason as _reason
from ._run_owners import Fence, RunOwners
from ._schema import (
    VERSION_KEY,
    claims,
    ensure_schema,
    events,
    runs,
    store_meta,
)
from ._sessions import LoginSessions
from ._settings import Settings
from ._view_codec import dumps, view_from_json

_INTERRUPTED_STATES = (
    RunState.RUNNING.value,
    RunState.AWAITING_MODEL.value,
    RunState.AWAITING_TOOL.value,
)
# Scan size when a label filter has to look past rows the SQL prefilter let through.
_LABEL_SCAN_CHUNK = 200
# Any constant works: it only has to be the same in every salvor process.
_PG_SCHEMA_LOCK = 0x5A1F0
# How many runs' (events, bytes) a store with a quota remembers; one it forgot is counted again.
_REMEMBERED_RUNS = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendRequest:
    """One run's batch for ``EventStore.append_batch`` (the arguments of ``append``)."""

    run_id: str
    events: Sequence[Event]
    view: RunView
    claim: str | None = None
    settle: str | None = None
    release: str | None = None
    # The driver's fence (``append``'s ``fence``); None: unfenced.
    fence: Fence | None = None


# -- statements, built once ---------------------------------------------------
_SELECT_LOG = (
    select(
        events.c.seq, events.c.schema_version, events.c.kind, events.c.recorded_at, events.c.payload
    )
    .where(events.c.run_id == bindparam("run_id"), events.c.seq >= bindparam("from_seq"))
    .order_by(events.c.seq)
)
# A page of the log: at most ``limit`` events, and (with ``upto``) none past that seq.
_SELECT_LOG_PAGE = _SELECT_LOG.limit(bindparam("limit"))
_SELECT_LOG_UPTO = _SELECT_LOG.where(events.c.seq <= bindparam("upto"))


def _payload_sizes(dialect: str):
    """Each event's seq and stored payload size in bytes, from a cursor, ``limit`` at most.

    PostgreSQL's ``octet_length`` reads a long value's size without fetching it; SQLite (3.40
    has no ``octet_length``) counts the bytes of the value cast to a blob.
    """
    if dialect == "postgresql":
        size = func.octet_length(events.c.payload)
    else:
        size = func.length(cast(events.c.payload, LargeBinary))
    return (
        select(events.c.seq, size.label("size"))
        .where(events.c.run_id == bindparam("run_id"), events.c.seq >= bindparam("from_seq"))
        .order_by(events.c.seq)
        .limit(bindparam("limit"))
    )


_SELECT_VIEW = select(runs.c.view).where(runs.c.run_id == bindparam("run_id"))
_SUMMARY_COLUMNS = (
    runs.c.run_id,
    runs.c.event_count,
    runs.c.first_recorded_at,
    runs.c.last_recorded_at,
    runs.c.status,
    runs.c.state,
    runs.c.input_tokens,
    runs.c.output_tokens,
    runs.c.step_count,
    runs.c.agent_def_hash,
    runs.c.graph_hash,
    runs.c.labels,
    runs.c.driven_by,
    runs.c.wake_at,
    runs.c.pending,
)
# Literal state so SQLite's planner can use the partial index on sleeping runs.
_SELECT_FORKS = (
    select(runs.c.run_id, runs.c.view)
    .where(runs.c.forked_from == bindparam("origin"))
    .order_by(runs.c.first_recorded_at, runs.c.run_id)
)
_DUE_RUNS = (
    select(runs.c.run_id)
    .where(
        text("state = 'sleeping'"),
        runs.c.wake_at <= bindparam("now"),
        runs.c.driven_by.is_(None),
    )
    .order_by(runs.c.wake_at, runs.c.run_id)
)
# Literal state, so both planners read ix_runs_unreconciled (a partial index) in its order.
_PARKED_WRITES = (
    select(runs.c.run_id, runs.c.last_recorded_at, runs.c.view)
    .where(text("state = 'needs_reconciliation'"))
    .order_by(runs.c.last_recorded_at, runs.c.run_id)
)
# The operator's counts (``census``): runs per state, and the identities some intent holds open.
_RUNS_BY_STATE = select(runs.c.state, func.count()).group_by(runs.c.state)
_OPEN_CLAIMS = select(func.count()).select_from(claims).where(claims.c.state == "open")
_INTERRUPTED_RUNS = (
    select(runs.c.run_id)
    .where(runs.c.state.in_(_INTERRUPTED_STATES), runs.c.driven_by.is_(None))
    .order_by(runs.c.last_recorded_at, runs.c.run_id)
)


class _StaleConnection(Exception):
    """The held write connection was found dead before anything was sent to commit."""


class EventStore:
    """Run logs and their folds in SQLite or PostgreSQL. Safe to share between threads.

    Error handling: every method raises ``StoreUnavailable`` when the
    database cannot be reached or fails underneath it; a failed write left
    nothing behind.
    """

    def __init__(
        self,
        engine: Engine,
        url: str,
        *,
        notifications: bool = False,
        commit_observer: Callable[[int, float], None] | None = None,
        quota: RunQuota | None = None,
    ) -> None:
        """Use ``EventStore.open``; this wraps an engine whose schema is already current."""
        self._engine = engine
        # Whether appends write the outbox rows they call for (``open``'s ``notifications``).
        self.notifications = notifications
        self._reader = engine.execution_options(**{READ_OPTION: True})
        self.url = display_url(url)
        self.dialect = engine.dialect.name
        self._writes = Writes(engine.dialect)
        self._select_sizes = _payload_sizes(self.dialect)
        self._dbapi_error = engine.dialect.loaded_dbapi.Error
        self._integrity_error = engine.dialect.loaded_dbapi.IntegrityError
        # SQLite's driver was told not to begin transactions (see _engine).
        self._begin = "BEGIN IMMEDIATE" if self.dialect == "sqlite" else None
        # Appends share one held connection: they serialise on the database's
        # write lock anyway, and a pool checkout per append costs more than
        # the statements.
        self._write_lock = threading.Lock()
        self._writer: Any = None
        # What tells other processes over this store that an append committed (issue 30).
        self.changes = ChangeSignal(engine, url)
        # Told of every committed append transaction (its events, its seconds), on the
        # committing thread: the daemon counts commits here without the store knowing it.
        self._commit_observer = commit_observer
        # What one run may make this store keep (``open``'s ``quota``); None: no limit.
        self.quota = quota
        # run id -> (events, bytes) of its log, a fact once true (see ``_quota``).
        self._run_bytes: dict[str, tuple[int, int]] = {}
        self._run_bytes_lock = threading.Lock()
        # A payload's stored size: SQLite's length() counts characters of a text, so a blob's.
        self._payload_size = (
            func.length(cast(events.c.payload, LargeBinary))
            if self.dialect == "sqlite"
            else func.octet_length(events.c.payload)
        )
        # Agents and graphs, content-addressed.
        self.definitions = Definitions(engine, url)
        # Operator settings; idempotency claims and probe answers.
        self.settings = Settings(engine, url)
        self.claims = Claims(engine, url)
        # Node leases and run ownership (issue 30, run ownership).
        self.owners = RunOwners(engine, url)
        # One repository per table family beyond the logs (issue 30: the state several nodes
        # share lives in the store).
        self.outbox = Outbox(engine, url)
        self.client_leases = ClientLeases(engine, url)
        self.sessions = LoginSessions(engine, url)

    # -- lifecycle ------------------------------------------------------------

    @classmethod
    def open(
        cls,
        url: str,
        *,
        synchronous: str = "FULL",
        notifications: bool = False,
        commit_observer: Callable[[int, float], None] | None = None,
        quota: RunQuota | None = None,
    ) -> EventStore:
        """Open (creating or upgrading) the store at ``url``.

        Args:
            url: a file path, ``sqlite:///PATH`` or ``postgresql://...``.
            synchronous: SQLite's ``synchronous`` pragma, FULL (the default:
                a commit survives power loss), NORMAL or OFF.
            notifications: every append that makes a run start waiting on a
                person, or fail, writes its outbox row (``notifications``) in
                its own transaction. Only a daemon that delivers them opens a
                store so; anything else writes none.
            commit_observer: called after each append transaction commits, on
                the thread that committed it, with the number of events it
                wrote and how many seconds it took from BEGIN to COMMIT. It
                must be quick and must not raise: an exception from it reaches
                the appender although its rows are durable.
            quota: what one run may make the store keep (``RunQuota``): an append
                past it is refused with ``QuotaExceeded`` or ``PayloadTooLarge``,
                nothing written. None: no limit.

        Raises:
            StoreUnavailable: the store cannot be created, reached or read.
            StoreTooNew: the store was written by a newer salvor.
        """
        url = normalize_store_url(url)
        engine = create_store_engine(url, synchronous=synchronous)
        try:
            with engine.begin() as connection:
                if engine.dialect.name == "postgresql":
                    # Two daemons opening a new database must not both create it.
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_SCHEMA_LOCK}
                    )
                ensure_schema(connection, describe=display_url(url))
        except StoreError:
            engine.dispose()
            raise
        except (SQLAlchemyError, OSError) as exc:
            engine.dispose()
            raise StoreUnavailable(
                f"cannot open the store at {display_url(url)}: {_reason(exc)}"
            ) from None
        return cls(
            engine, url, notifications=notifications, commit_observer=commit_observer, quota=quota
        )

    def close(self) -> None:
        """Release every connection. The store must not be used afterwards."""
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EventStore {self.url}>"

    # -- appending ----------------------------------------------------------

    def append(
        self,
        run_id: str,
        events: Sequence[Event],
        view: RunView,
        *,
        claim: str | None = None,
        settle: str | None = None,
        release: str | None = None,
        fence: Fence | None = None,
    ) -> tuple[list[Envelope], RunView]:
        """Append ``events`` to ``run_id``'s log after ``view``, durably, in one transaction.

        Args:
            run_id: the run.
            events: the batch, recorded at ``view.next_seq``, ``+1``, ...
            view: the run's current view (``EMPTY_VIEW`` for a new run).
            claim: an idempotency identity to claim for the batch's
                ``ToolCallRequested``.
            settle: an identity to mark settled with the output of the batch's
                ``ToolCallCompleted``.
            release: an identity to give up with the batch's ``ToolCallCompleted``
                (a failed call: it leaves no outcome to copy), when that call's
                intent holds it open; otherwise nothing happens to it.
            fence: the driver's (``RunOwners.claim``): written only while the run's owner is
                still that node at that epoch; a creating append makes it the run's owner.

        Returns:
            The recorded envelopes and the view after them.

        Raises:
            GuardRefusal: the batch is not legal after ``view``.
            SeqConflict: another writer appended at one of these seqs first.
            ClaimHeld: ``claim`` (or ``settle``) belongs to another intent.
            Fenced: ``fence`` is stale (the run was claimed by another node, or again).
            QuotaExceeded / PayloadTooLarge: the batch is over the store's quota.
            StoreUnavailable: the database failed.
            ValueError: an empty batch, ``claim``/``settle``/``release`` without
                its event, or both ``settle`` and ``release``.

        Every failure leaves the store as it was: nothing of the batch is written.
        """
        prepared = prepare(
            run_id, events, view, claim, settle, release, notify=self.notifications, fence=fence
        )
        after = self._within_quota(prepared)
        fenced = self._commit([prepared])
        if fenced:
            raise fenced[0]
        self._remember_bytes(prepared, after)
        return prepared.envelopes, prepared.view

    def append_batch(
        self, requests: Sequence[AppendRequest]
    ) -> list[tuple[list[Envelope], RunView] | StoreError | GuardRefusal | ValueError]:
        """Group commit: append many runs' batches in one transaction and one fsync.

        Each request is guard-checked first; a refused one gets its
        ``GuardRefusal`` (or ``ValueError`` for a misuse) and the others go
        on. If the shared transaction fails, it is retried as one
        transaction per request, so every caller gets its own outcome.

        Returns:
            One result per request, in order: ``(envelopes, view)`` when it
            was committed, else the exception that ``append`` would have raised.
        """
        results: list[Any] = [None] * len(requests)
        accepted: list[tuple[int, Prepared, int | None]] = []
        for index, request in enumerate(requests):
            try:
                prepared = prepare(
                    request.run_id,
                    request.events,
                    request.view,
                    request.claim,
                    request.settle,
                    request.release,
                    notify=self.notifications,
                    fence=request.fence,
                )
                after = self._within_quota(prepared)
            except (GuardRefusal, ValueError, StoreError) as exc:
                results[index] = exc
            else:
                accepted.append((index, prepared, after))
        if not accepted:
            return results
        try:
            fenced = self._commit([prepared for _, prepared, _ in accepted])
        except StoreError:
            for index, prepared, after in accepted:
                try:
                    alone = self._commit([prepared])
                except StoreError as exc:
                    results[index] = exc
                else:
                    if alone:
                        results[index] = alone[0]
                    else:
                        results[index] = (prepared.envelopes, prepared.view)
                        self._remember_bytes(prepared, after)
        else:
            for position, (index, prepared, after) in enumerate(accepted):
                if position in fenced:
                    results[index] = fenced[position]
                else:
                    results[index] = (prepared.envelopes, prepared.view)
                    self._remember_bytes(prepared, after)
        return results

    # -- quotas -------------------------------------------------------------

    def _within_quota(self, prepared: Prepared) -> int | None:
        """The run's bytes after ``prepared``, once the store's quota takes it (None: no quota).

        Raises:
            QuotaExceeded / PayloadTooLarge: it is over the quota; nothing was written.
            StoreUnavailable: the run's bytes so far could not be counted.
        """
        if self.quota is None:
            return None
        count = prepared.previous_count
        held = (count, self._bytes_of_first(prepared.run_id, count))
        return bytes_after(
            self.quota,
            prepared.run_id,
            held,
            [envelope.event for envelope in prepared.envelopes],
            [row["payload"] for row in prepared.event_rows],
        )

    def _bytes_of_first(self, run_id: str, count: int) -> int:
        """The stored bytes of ``run_id``'s first ``count`` events: remembered, else summed
        (once per run and process: a run this process has not appended to, or forgot)."""
        if count == 0:
            return 0
        with self._run_bytes_lock:
            known = self._run_bytes.get(run_id)
        if known is not None and known[0] == count:
            return known[1]
        statement = select(func.coalesce(func.sum(self._payload_size), 0)).where(
            events.c.run_id == run_id, events.c.seq < count
        )
        with self._reading("count a run's stored bytes"), self._read() as connection:
            return int(connection.execute(statement).scalar_one())

    def _remember_bytes(self, prepared: Prepared, after: int | None) -> None:
        if after is None:
            return
        with self._run_bytes_lock:
            self._run_bytes.pop(prepared.run_id, None)
            if len(self._run_bytes) >= _REMEMBERED_RUNS:
                del self._run_bytes[next(iter(self._run_bytes))]
            self._run_bytes[prepared.run_id] = (prepared.view.next_seq, after)

    def _commit(self, batch: list[Prepared]) -> dict[int, Fenced]:
        """Own the transaction boundary of one or more prepared appends.

        Returns:
            The appends refused for a stale fence, by position in ``batch``: nothing of them
            was written, and the others of the batch committed.

        Raises:
            SeqConflict, ClaimHeld: the transaction was rolled back.
            StoreUnavailable: the database failed; the transaction was rolled
                back and the held connection dropped, to be replaced on the
                next append.
        """
        with self._write_lock:
            for attempt in (1, 2):
                connection = self._writer_connection()
                began = time.perf_counter()
                try:
                    fenced = self._append_all(connection, batch, may_retry=attempt == 1)
                except IdentityTaken as taken:
                    identity = taken.identity
                    break
                except _StaleConnection:
                    continue
                if self._commit_observer is not None and len(fenced) < len(batch):
                    self._commit_observer(
                        sum(
                            len(prepared.envelopes)
                            for position, prepared in enumerate(batch)
                            if position not in fenced
                        ),
                        time.perf_counter() - began,
                    )
                return fenced
        # Outside the lock: naming the holder is a read.
        raise self.claims.held(identity)

    def _writer_connection(self) -> Any:
        try:
            if self._writer is None:
                self._writer = self._engine.raw_connection()
        except SQLAlchemyError as exc:
            raise StoreUnavailable(
                f"the store at {self.url} cannot be reached for an append: {_reason(exc)}",
                transient=passes_by_itself(exc),
            ) from None
        return self._writer

    def _append_all(
        self, connection: Any, batch: list[Prepared], *, may_retry: bool
    ) -> dict[int, Fenced]:
        cursor = connection.cursor()
        committing = False
        try:
            if self._begin is not None:
                cursor.execute(self._begin)
            fenced = stale_fences(cursor, self._writes, batch)
            if fenced:
                batch = [p for position, p in enumerate(batch) if position not in fenced]
            if not batch:
                connection.rollback()
            elif len(batch) > 1 and all(
                p.claim is None and p.settle is None and p.release is None for p in batch
            ):
                append_group(cursor, self._writes, self._integrity_error, batch)
            else:
                for prepared in batch:
                    append_txn(cursor, self._writes, self._integrity_error, prepared)
            if batch:
                # Other processes' streams hear of it at commit (PostgreSQL's notices).
                self.changes.announce(cursor, batch)
                committing = True
                connection.commit()
        except BaseException as exc:
            broken = isinstance(exc, self._dbapi_error)
            # A held connection the server dropped while idle (a database
            # restart) fails before COMMIT was sent, so nothing can have been
            # written: one retry on a fresh connection is safe. A failure
            # during COMMIT is never retried.
            stale = (
                broken
                and may_retry
                and not committing
                and self._engine.dialect.is_disconnect(exc, connection.dbapi_connection, cursor)
            )
            self._roll_back(connection, cursor, dropping=broken)
            if not broken:
                raise
            if stale:
                raise _StaleConnection from None
            self._forget_connections_after(exc)
            raise StoreUnavailable(
                f"the store at {self.url} failed to commit an append: {_reason(exc)}",
                transient=passes_by_itself(exc),
            ) from None
        else:
            cursor.close()
        return fenced

    def _roll_back(self, connection: Any, cursor: Any, *, dropping: bool) -> None:
        try:
            cursor.close()
            connection.rollback()
        except (self._dbapi_error, SQLAlchemyError):
            dropping = True
        if dropping:
            # The connection may be broken; never reuse it.
            self._writer = None
            connection.invalidate()

    def _forget_connections_after(self, exc: BaseException) -> None:
        """After a write that may pass by itself failed on SQLite, open every connection afresh.

        SQLite opens a file it cannot write read-only, silently: a pooled
        connection opened while the file was unwritable would refuse writes
        forever after the file is writable again. Readers holding one keep it
        until they return it; it is closed then.
        """
        if self.dialect == "sqlite" and passes_by_itself(exc):
            self._engine.dispose()

    def check_writable(self) -> None:
        """Commit one write that changes nothing, to learn whether the store accepts writes now.

        It negates the schema-version row and negates it back in one
        transaction: a real write that reaches the database's log (a full
        disk or a read-only file refuses it), and no reader sees a
        difference. (Writing the row's own value would not do: SQLite skips
        a write whose bytes are unchanged, and commits nothing.)

        Raises:
            StoreUnavailable: the store refused the write (``transient`` when
                the failure may pass by itself); nothing changed.
        """
        statement = (
            update(store_meta)
            .where(store_meta.c.key == VERSION_KEY)
            .values(value=-store_meta.c.value)
        )
        try:
            with self._engine.begin() as connection:
                connection.execute(statement)
                connection.execute(statement)
        except SQLAlchemyError as exc:
            self._forget_connections_after(exc)
            raise StoreUnavailable(
                f"the store at {self.url} does not accept writes: {_reason(exc)}",
                transient=passes_by_itself(exc),
            ) from None

    # -- reading a run ------------------------------------------------------

    def _read(self) -> Connection:
        return self._reader.connect()

    def _reading(self, what: str):
        return _ReadErrors(self.url, what)

    def read_log(
        self,
        run_id: str,
        from_seq: int = 0,
        *,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> list[Envelope]:
        """The run's envelopes from ``from_seq`` on, ordered by seq ([] for an unknown run).

        Args:
            limit: at most this many envelopes (all when None).
            max_bytes: no more envelopes than fit in this many bytes of stored payload (the
                first is read whatever its size, so a reader paging through always moves on).
                Needs ``limit``: the page's sizes are read first, then the envelopes that fit.

        Raises:
            CorruptLog: a stored envelope cannot be decoded (names run and seq).
            StoreUnavailable: the database failed.
        """
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        if max_bytes is not None and limit is None:
            raise ValueError("max_bytes needs a limit")
        params: dict[str, Any] = {"run_id": run_id, "from_seq": from_seq}
        with self._reading("read a run's log"), self._read() as connection:
            if limit is None:
                rows = connection.execute(_SELECT_LOG, params).all()
            elif max_bytes is None:
                rows = connection.execute(_SELECT_LOG_PAGE, {**params, "limit": limit}).all()
            else:
                upto = _last_within(
                    connection.execute(self._select_sizes, {**params, "limit": limit}), max_bytes
                )
                rows = (
                    []
                    if upto is None
                    else connection.execute(_SELECT_LOG_UPTO, {**params, "upto": upto}).all()
                )
        return [_envelope(run_id, row) for row in rows]

    def read_view(self, run_id: str) -> RunView | None:
        """The run's current view from its ``runs`` row, without reading the log.

        A row whose view cannot be decoded is recomputed by folding the log.

        Returns:
            The view, or None when the run has no events.

        Raises:
            CorruptLog: the row is unreadable and so is the log behind it.
            StoreUnavailable: the database failed.
        """
        with self._reading("read a run's view"), self._read() as connection:
            stored = connection.execute(_SELECT_VIEW, {"run_id": run_id}).scalar_one_or_none()
        if stored is None:
            return None
        try:
            return view_from_json(json.loads(stored))
        except (ValueError, TypeError, KeyError):
            log = self.read_log(run_id)
            return fold(log) if log else None

    def list_runs(
        self,
        *,
        state: str | None = None,
        label: tuple[str, str] | None = None,
        agent_def_hash: str | None = None,
        graph_hash: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> tuple[list[RunSummary], str | None]:
        """Runs newest first (by first event, then run id), one page at a time.

        Args:
            state: only runs in this state.
            label: only runs whose labels hold this ``(key, value)``.
            agent_def_hash: only the runs of this agent (as their head recorded it).
            graph_hash: only the runs of this graph (its forks too: they run the same graph).
            limit: at most this many runs (all when None).
            after: the cursor a previous page returned.

        Returns:
            The page and the cursor of the next one (None when this was the last).

        Raises:
            BadCursor: ``after`` is not a cursor this store issued.
            StoreUnavailable: the database failed.
        """
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        base = select(*_SUMMARY_COLUMNS)
        if state is not None:
            base = base.where(runs.c.state == state)
        if agent_def_hash is not None:
            base = base.where(runs.c.agent_def_hash == agent_def_hash)
        if graph_hash is not None:
            base = base.where(runs.c.graph_hash == graph_hash)
        if label is not None:
            key, value = label
            # A superset in SQL (the labels text holds `"key":"value"`), exact in Python.
            base = base.where(
                runs.c.labels.contains(dumps(key) + ":" + dumps(value), autoescape=True)
            )
        base = base.order_by(runs.c.first_recorded_at.desc(), runs.c.run_id.desc())
        position = decode_cursor(after) if after is not None else None
        want = None if limit is None else limit + 1
        page: list[RunSummary] = []
        with self._reading("list runs"), self._read() as connection:
            for summary in self._scan(connection, base, position, want if label is None else None):
                if label is not None and (summary.labels or {}).get(label[0]) != label[1]:
                    continue
                page.append(summary)
                if want is not None and len(page) == want:
                    break
        if limit is not None and len(page) > limit:
            page = page[:limit]
            return page, encode_cursor(page[-1])
        return page, None

    def _scan(
        self, connection: Connection, base: Any, position: tuple[str, str] | None, chunk: int | None
    ) -> Iterator[RunSummary]:
        """Summaries in listing order after ``position``, fetched ``chunk`` rows at a time."""
        chunk = chunk or _LABEL_SCAN_CHUNK
        while True:
            statement = base
            if position is not None:
                first, run_id = position
                # A row comparison, so both databases seek in ix_runs_listing
                # instead of walking it from the top and discarding rows.
                statement = statement.where(
                    tuple_(runs.c.first_recorded_at, runs.c.run_id) < tuple_(first, run_id)
                )
            rows = connection.execute(statement.limit(chunk)).all()
            for row in rows:
                yield summary_from_row(row)
            if len(rows) < chunk:
                return
            position = (rows[-1].first_recorded_at, rows[-1].run_id)

    def parked_writes(
        self, *, limit: int | None = None, after: str | None = None
    ) -> tuple[list[ParkedWrite], str | None]:
        """Runs parked on a write of unknown outcome (``needs_reconciliation``), oldest write
        first (by when its intent was recorded, then run id), one page at a time.

        Read from the runs rows through their partial index; no log is folded unless a row's
        view cannot be decoded (then that run's log is, as ``read_view`` does).

        Args:
            limit: at most this many runs (all when None).
            after: the cursor a previous page returned.

        Returns:
            The page and the cursor of the next one (None when this was the last).

        Raises:
            BadCursor: ``after`` is not a cursor this store issued.
            CorruptLog: a row's view and the log behind it are both unreadable.
            StoreUnavailable: the database failed.
        """
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        statement = _PARKED_WRITES
        if after is not None:
            since, run_id = decode_cursor(after)
            statement = statement.where(
                tuple_(runs.c.last_recorded_at, runs.c.run_id) > tuple_(since, run_id)
            )
        if limit is not None:
            statement = statement.limit(limit + 1)
        with self._reading("list parked writes"), self._read() as connection:
            rows = connection.execute(statement).all()
        more = limit is not None and len(rows) > limit
        rows = rows[:limit] if more else rows
        page = [ParkedWrite(run_id=row.run_id, view=self._row_view(row)) for row in rows]
        # The row's own ordering column, so the next page seeks exactly where this one ended.
        return page, (encode_position(rows[-1].last_recorded_at, rows[-1].run_id) if more else None)

    def list_forks(self, run_id: str) -> list[RunView]:
        """The views of the runs forked from ``run_id`` (their head's ``forked_from`` names it),
        oldest first; [] when it has none, or is no run.

        Read through the partial index on ``runs.forked_from``: no log is read unless a row's
        view cannot be decoded (then that run's log is folded, as ``read_view`` does).

        Raises:
            CorruptLog: a row's view and the log behind it are both unreadable.
            StoreUnavailable: the database failed.
        """
        with self._reading("list a run's forks"), self._read() as connection:
            rows = connection.execute(_SELECT_FORKS, {"origin": run_id}).all()
        return [self._row_view(row) for row in rows]

    def _row_view(self, row: Any) -> RunView:
        try:
            return view_from_json(json.loads(row.view))
        except (ValueError, TypeError, KeyError):
            return fold(self.read_log(row.run_id))

    def due_runs(self, now: datetime) -> list[str]:
        """Server-driven sleeping runs whose ``wake_at`` is at or before ``now``, soonest first."""
        with self._reading("find due runs"), self._read() as connection:
            return list(connection.execute(_DUE_RUNS, {"now": format_instant(now)}).scalars())

    def census(self) -> tuple[dict[str, int], int]:
        """How many runs are in each state (states with none left out), and how many
        idempotency identities an intent holds open (claimed, not yet settled).

        Two aggregate reads of the ``runs`` and ``claims`` tables; no log is read.

        Raises:
            StoreUnavailable: the database failed.
        """
        with self._reading("count runs and claims"), self._read() as connection:
            by_state = {state: count for state, count in connection.execute(_RUNS_BY_STATE)}
            held = connection.execute(_OPEN_CLAIMS).scalar_one()
        return by_state, held

    def interrupted_runs(self) -> list[str]:
        """Server-driven runs whose log stops mid-flight (running, awaiting a model or a tool)."""
        with self._reading("find interrupted runs"), self._read() as connection:
            return list(connection.execute(_INTERRUPTED_RUNS).scalars())


def _last_within(sizes: Any, max_bytes: int) -> int | None:
    """The last seq of ``(seq, size)`` rows whose sizes, summed from the first, stay within
    ``max_bytes`` (the first row's seq whatever its size); None for no rows."""
    last, total = None, 0
    for seq, size in sizes:
        total += size or 0
        if last is not None and total > max_bytes:
            break
        last = seq
    return last


def _envelope(run_id: str, row: Any) -> Envelope:
    try:
        event = decode_event(row.kind, json.loads(row.payload), seq=row.seq)
    except (ValueError, TypeError, MalformedEvent) as exc:
        raise CorruptLog(
            f"the stored event of run {run_id} at seq {row.seq} cannot be decoded ({exc}); "
            "the log needs repair",
            run_id=run_id,
            seq=row.seq,
        ) from None
    return Envelope(
        run_id=run_id,
        seq=row.seq,
        schema_version=row.schema_version,
        recorded_at=row.recorded_at,
        event=event,
    )


class _ReadErrors:
    """Turns a database failure during a read into StoreUnavailable."""

    __slots__ = ("_url", "_what")

    def __init__(self, url: str, what: str) -> None:
        self._url = url
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if isinstance(exc, SQLAlchemyError):
            raise StoreUnavailable(
                f"the store at {self._url} failed to {self._what}: {_reason(exc)}",
                transient=passes_by_itself(exc),
            ) from None
        return False
