"""The reads of the run logs and their folds (``store.runs``): one run's log or view, the
listings, and the sweeps' finds (due, interrupted, parked, forked).

Rules of this module:

* Reads never fail a whole listing for one run's bad row: the failure is scoped to that run's
  entry (a row whose view cannot be decoded is recomputed by folding its log).
* Every read is a transaction of its own on a reader connection (deferred on SQLite).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from salvor.protocol import (
    Envelope,
    MalformedEvent,
    RunState,
    RunView,
    decode_event,
    fold,
    format_instant,
)
from sqlalchemy import Connection, Engine, LargeBinary, bindparam, cast, func, select, text, tuple_

from ._errors import CorruptLog
from ._records import (
    ParkedWrite,
    RunSummary,
    decode_cursor,
    encode_cursor,
    encode_position,
    summary_from_row,
)
from ._repository import Repository
from ._schema import claims, events, runs
from ._view_codec import dumps, view_from_json

_INTERRUPTED_STATES = (
    RunState.RUNNING.value,
    RunState.AWAITING_MODEL.value,
    RunState.AWAITING_TOOL.value,
)
# Scan size when a label filter has to look past rows the SQL prefilter let through.
_LABEL_SCAN_CHUNK = 200

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
_SELECT_FORKS = (
    select(runs.c.run_id, runs.c.view)
    .where(runs.c.forked_from == bindparam("origin"))
    .order_by(runs.c.first_recorded_at, runs.c.run_id)
)
# Literal state so SQLite's planner can use the partial index on sleeping runs.
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


class RunReads(Repository):
    """The ``events`` and ``runs`` tables, read (the writer path is ``_appends``)."""

    def __init__(self, engine: Engine, url: str) -> None:
        super().__init__(engine, url)
        self._select_sizes = _payload_sizes(self.dialect)

    # -- one run ----------------------------------------------------------------

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
        with self._reading("read a run's log") as connection:
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
        with self._reading("read a run's view") as connection:
            stored = connection.execute(_SELECT_VIEW, {"run_id": run_id}).scalar_one_or_none()
        if stored is None:
            return None
        try:
            return view_from_json(json.loads(stored))
        except (ValueError, TypeError, KeyError):
            log = self.read_log(run_id)
            return fold(log) if log else None

    def _row_view(self, row: Any) -> RunView:
        try:
            return view_from_json(json.loads(row.view))
        except (ValueError, TypeError, KeyError):
            return fold(self.read_log(row.run_id))

    # -- listings ---------------------------------------------------------------

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
        base = _listing(state, label, agent_def_hash, graph_hash)
        position = decode_cursor(after) if after is not None else None
        want = None if limit is None else limit + 1
        page: list[RunSummary] = []
        with self._reading("list runs") as connection:
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
        with self._reading("list parked writes") as connection:
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
        with self._reading("list a run's forks") as connection:
            rows = connection.execute(_SELECT_FORKS, {"origin": run_id}).all()
        return [self._row_view(row) for row in rows]

    # -- the sweeps' finds --------------------------------------------------------

    def due_runs(self, now: datetime) -> list[str]:
        """Server-driven sleeping runs whose ``wake_at`` is at or before ``now``, soonest first."""
        with self._reading("find due runs") as connection:
            return list(connection.execute(_DUE_RUNS, {"now": format_instant(now)}).scalars())

    def census(self) -> tuple[dict[str, int], int]:
        """How many runs are in each state (states with none left out), and how many
        idempotency identities an intent holds open (claimed, not yet settled).

        Two aggregate reads of the ``runs`` and ``claims`` tables; no log is read.

        Raises:
            StoreUnavailable: the database failed.
        """
        with self._reading("count runs and claims") as connection:
            by_state = {state: count for state, count in connection.execute(_RUNS_BY_STATE)}
            held = connection.execute(_OPEN_CLAIMS).scalar_one()
        return by_state, held

    def interrupted_runs(self) -> list[str]:
        """Server-driven runs whose log stops mid-flight (running, awaiting a model or a tool)."""
        with self._reading("find interrupted runs") as connection:
            return list(connection.execute(_INTERRUPTED_RUNS).scalars())


def _listing(
    state: str | None,
    label: tuple[str, str] | None,
    agent_def_hash: str | None,
    graph_hash: str | None,
) -> Any:
    """``list_runs``'s statement for its filters, newest first (without its page's bounds)."""
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
        base = base.where(runs.c.labels.contains(dumps(key) + ":" + dumps(value), autoescape=True))
    return base.order_by(runs.c.first_recorded_at.desc(), runs.c.run_id.desc())


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
