"""The run logs' writer path: every append, alone or group-committed (``store.writer``).

Rules of this module:

* An append is one transaction: the batch's events, the run's ``runs`` row (the fold after the
  batch), any idempotency claim change and the outbox row the batch calls for (a store opened
  with notifications on) commit together or not at all. A refused, conflicting or failed append
  leaves the store exactly as it was.
* The guard runs before the transaction: nothing the pure core refuses is ever offered to the
  database, and no lock is held while it decides.
* ``recorded_at`` is this store's clock, read once per batch.
* Statements are built once (``_append_rows``) and read nothing, but to settle a claim they did
  not find.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from salvor.protocol import Envelope, Event, GuardRefusal, RunView
from sqlalchemy import Engine, LargeBinary, cast, func, select
from sqlalchemy.exc import SQLAlchemyError

from ._append_rows import (
    IdentityTaken,
    Prepared,
    Writes,
    append_group,
    append_txn,
    prepare,
    release_owners,
    stale_fences,
)
from ._change_signal import ChangeSignal
from ._claims import Claims
from ._errors import Fenced, StoreError, StoreUnavailable, passes_by_itself
from ._quota import RunQuota, bytes_after
from ._repository import Repository, failure_reason
from ._run_owners import Fence, OwnerRelease
from ._schema import events

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


class _StaleConnection(Exception):
    """The held write connection was found dead before anything was sent to commit."""


class LogWriter(Repository):
    """Appends to the ``events`` and ``runs`` tables (with claims and outbox rows), on one held
    connection. Safe to share between threads: appends take turns on it."""

    def __init__(
        self,
        engine: Engine,
        url: str,
        *,
        changes: ChangeSignal,
        claims: Claims,
        notifications: bool,
        commit_observer: Callable[[int, float, int], None] | None,
        quota: RunQuota | None,
    ) -> None:
        """Built by ``EventStore.open`` (``store.writer``); the arguments are ``open``'s."""
        super().__init__(engine, url)
        self.notifications = notifications
        self.quota = quota
        self._changes = changes
        # Names the holder when an append's identity is taken.
        self._claims = claims
        self._commit_observer = commit_observer
        self._writes = Writes(engine.dialect)
        self._dbapi_error = engine.dialect.loaded_dbapi.Error
        self._integrity_error = engine.dialect.loaded_dbapi.IntegrityError
        # SQLite's driver was told not to begin transactions (see _engine).
        self._begin = "BEGIN IMMEDIATE" if self.dialect == "sqlite" else None
        # Appends share one held connection: they serialise on the database's
        # write lock anyway, and a pool checkout per append costs more than
        # the statements.
        self._write_lock = threading.Lock()
        self._writer: Any = None
        # run id -> (events, bytes) of its log, a fact once true (see ``_quota``).
        self._run_bytes: dict[str, tuple[int, int]] = {}
        self._run_bytes_lock = threading.Lock()
        # A payload's stored size: SQLite's length() counts characters of a text, so a blob's.
        self._payload_size = (
            func.length(cast(events.c.payload, LargeBinary))
            if self.dialect == "sqlite"
            else func.octet_length(events.c.payload)
        )

    def close(self) -> None:
        """Close the held write connection (a later append would open another)."""
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

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
        self, requests: Sequence[AppendRequest | OwnerRelease]
    ) -> list[tuple[list[Envelope], RunView] | StoreError | GuardRefusal | ValueError | None]:
        """Group commit: append many runs' batches in one transaction and one fsync.

        Each request is guard-checked first; a refused one gets its
        ``GuardRefusal`` (or ``ValueError`` for a misuse) and the others go
        on. If the shared transaction fails, it is retried as one
        transaction per request, so every caller gets its own outcome.

        An ``OwnerRelease`` among them (a drive letting its run go, as ``RunOwners.release``)
        is written in the same transaction, after the appends: a daemon's drives end without
        a transaction (and an fsync) of their own, and without waiting on the writer for the
        store's write lock. If the shared transaction fails, the releases are retried together
        in one of their own.

        Returns:
            One result per request, in order: ``(envelopes, view)`` when it
            was committed (None for a release), else the exception that ``append``
            (``RunOwners.release``) would have raised.
        """
        results: list[Any] = [None] * len(requests)
        accepted: list[tuple[int, Prepared, int | None]] = []
        releases = [(i, r) for i, r in enumerate(requests) if isinstance(r, OwnerRelease)]
        for index, request in enumerate(requests):
            if isinstance(request, OwnerRelease):
                continue
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
        owned = [release for _, release in releases]
        if not accepted and not owned:
            return results
        try:
            fenced = self._commit([prepared for _, prepared, _ in accepted], owned)
        except StoreError:
            if owned:
                try:
                    self._commit([], owned)
                except StoreError as exc:
                    for index, _ in releases:
                        results[index] = exc
            for index, prepared, after in accepted:
                results[index] = self._commit_alone(prepared, after)
        else:
            for position, (index, prepared, after) in enumerate(accepted):
                if position in fenced:
                    results[index] = fenced[position]
                else:
                    results[index] = (prepared.envelopes, prepared.view)
                    self._remember_bytes(prepared, after)
        return results

    def _commit_alone(self, prepared: Prepared, after: int | None) -> Any:
        """One request of a group whose shared transaction failed, in its own transaction:
        ``(envelopes, view)``, or the error ``append`` would have raised."""
        try:
            alone = self._commit([prepared])
        except StoreError as exc:
            return exc
        if alone:
            return alone[0]
        self._remember_bytes(prepared, after)
        return (prepared.envelopes, prepared.view)

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
        with self._reading("count a run's stored bytes") as connection:
            return int(connection.execute(statement).scalar_one())

    def _remember_bytes(self, prepared: Prepared, after: int | None) -> None:
        if after is None:
            return
        with self._run_bytes_lock:
            self._run_bytes.pop(prepared.run_id, None)
            if len(self._run_bytes) >= _REMEMBERED_RUNS:
                del self._run_bytes[next(iter(self._run_bytes))]
            self._run_bytes[prepared.run_id] = (prepared.view.next_seq, after)

    # -- the transaction ----------------------------------------------------

    def _commit(
        self, batch: list[Prepared], releases: Sequence[OwnerRelease] = ()
    ) -> dict[int, Fenced]:
        """Own the transaction boundary of one or more prepared appends (and ``releases``).

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
                    # In its turn at SQLite's write lock, with the other processes' writers.
                    with self._turns.taken():
                        fenced = self._append_all(
                            connection, batch, releases, may_retry=attempt == 1
                        )
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
                        len(batch) - len(fenced),
                    )
                return fenced
        # Outside the lock: naming the holder is a read.
        raise self._claims.held(identity)

    def _writer_connection(self) -> Any:
        try:
            if self._writer is None:
                self._writer = self._engine.raw_connection()
        except SQLAlchemyError as exc:
            raise StoreUnavailable(
                f"the store at {self.url} cannot be reached for an append: {failure_reason(exc)}",
                transient=passes_by_itself(exc),
            ) from None
        return self._writer

    def _append_all(
        self,
        connection: Any,
        batch: list[Prepared],
        releases: Sequence[OwnerRelease] = (),
        *,
        may_retry: bool,
    ) -> dict[int, Fenced]:
        cursor = connection.cursor()
        committing = False
        try:
            if self._begin is not None:
                cursor.execute(self._begin)
            fenced = stale_fences(cursor, self._writes, batch)
            if fenced:
                batch = [p for position, p in enumerate(batch) if position not in fenced]
            if not batch and not releases:
                connection.rollback()
            elif not batch:
                pass
            elif len(batch) > 1 and all(
                p.claim is None and p.settle is None and p.release is None for p in batch
            ):
                append_group(cursor, self._writes, self._integrity_error, batch)
            else:
                for prepared in batch:
                    append_txn(cursor, self._writes, self._integrity_error, prepared)
            if batch:
                # Other processes' streams hear of it at commit (PostgreSQL's notices).
                self._changes.announce(cursor, batch)
            if batch or releases:
                release_owners(cursor, self._writes, releases)
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
                f"the store at {self.url} failed to commit an append: {failure_reason(exc)}",
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
