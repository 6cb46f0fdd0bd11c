"""How an append becomes rows, and the statements that write them.

``prepare`` turns a run's batch into envelopes, lets the guard decide, and
builds every row before a transaction starts; ``append_txn`` writes one
prepared append inside a transaction its caller owns, ``append_group`` many
at once with one statement per kind of write. Nothing here commits: the
store (``_log_writer``) owns connections and transaction boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from salvor.protocol import (
    SCHEMA_VERSION,
    Envelope,
    Event,
    RunView,
    ToolCallCompleted,
    ToolCallRequested,
    check_batch,
    encode_payload,
    format_instant,
    parse_instant,
)
from sqlalchemy import bindparam, delete, insert, literal_column, select, update

from ._direct import DirectStatement
from ._errors import Fenced, SeqConflict
from ._notifications import notice_of, notification_row
from ._run_owners import Fence, OwnerRelease
from ._schema import claims, events, notifications, runs
from ._view_codec import dumps, view_to_json

# -- statements, built once ---------------------------------------------------

_EVENT_KEYS = ("run_id", "seq", "kind", "schema_version", "recorded_at", "payload")
_RUN_KEYS = tuple(column.name for column in runs.columns)
# What an append after the first may change. Leaving the rest (run_id,
# first_recorded_at, labels, ...) out of the SET keeps SQLite from rewriting
# the indexes on them, which is a page per index in every commit.
_PLACE_KEYS = ("state", "wake_at")
_MUTABLE_RUN_KEYS = _PLACE_KEYS + (
    "status",
    "input_tokens",
    "output_tokens",
    "step_count",
    "event_count",
    "last_recorded_at",
    "pending",
    "view",
)
_CLAIM_KEYS = ("identity", "run_id", "seq", "state", "output", "updated_at")
_NOTIFICATION_KEYS = (
    "run_id",
    "seq",
    "kind",
    "body",
    "created_at",
    "attempts",
    "next_attempt_at",
    "delivered_at",
)
_INSERT_NOTIFICATION = insert(notifications)
_INSERT_EVENTS = insert(events)
_INSERT_RUN = insert(runs)
# The WHERE pins the run to the seq the caller's view was at, so a stale or
# invented view cannot leave a gap in the log.
_UPDATE_RUN = update(runs).where(
    runs.c.run_id == bindparam("w_run_id"),
    runs.c.event_count == bindparam("w_event_count"),
)
_INSERT_CLAIM = insert(claims)
_SETTLE_CLAIM = (
    update(claims)
    .where(
        claims.c.identity == bindparam("w_identity"),
        claims.c.run_id == bindparam("w_run_id"),
        claims.c.seq == bindparam("w_seq"),
    )
    .values(
        state=bindparam("w_state"),
        output=bindparam("w_output"),
        updated_at=bindparam("w_updated_at"),
    )
)
# Only the claim this very intent holds, and only while open: a release never
# touches a settled outcome or somebody else's claim.
# A driver lets its run go (``RunOwners.release``), in a group commit's transaction.
_RELEASE_OWNER = (
    update(runs)
    .where(
        runs.c.run_id == bindparam("o_run_id"),
        runs.c.owner_node == bindparam("o_node_id"),
        runs.c.owner_epoch == bindparam("o_epoch"),
    )
    .values(owner_driving=literal_column("0"))
)
_RELEASE_CLAIM = delete(claims).where(
    claims.c.identity == bindparam("w_identity"),
    claims.c.run_id == bindparam("w_run_id"),
    claims.c.seq == bindparam("w_seq"),
    claims.c.state == bindparam("w_open"),
)
SELECT_CLAIM = select(
    claims.c.identity, claims.c.run_id, claims.c.seq, claims.c.state, claims.c.output
).where(claims.c.identity == bindparam("identity"))


# -- the prepared append ------------------------------------------------------


@dataclass(slots=True)
class Prepared:
    """A guard-accepted batch, turned into rows before any transaction starts."""

    run_id: str
    envelopes: list[Envelope]
    view: RunView
    previous_count: int
    # state and wake_at are what they were before the batch
    in_place: bool
    event_rows: list[dict]
    run_row: dict
    claim: dict | None
    settle: dict | None
    release: dict | None = None
    # The outbox row this append writes (a store opened with notifications on), or None.
    notification: dict | None = None
    # The driver's fence: the append is written only while the run's owner is still this node at
    # this epoch (``_log_writer`` checks it in the transaction). None: an unfenced append.
    fence: Fence | None = None


class IdentityTaken(Exception):
    """Raised inside a transaction; turned into ClaimHeld once it has rolled back."""

    def __init__(self, identity: str) -> None:
        self.identity = identity


def now_instant() -> str:
    return format_instant(datetime.now(UTC))


def _normal_wake_at(view: RunView) -> str | None:
    # Normalised so that `wake_at <= now` compares instants, whatever RFC 3339
    # spelling a client recorded.
    wake_at = view.wake_at()
    return None if wake_at is None else format_instant(parse_instant(wake_at))


def _run_row(view: RunView) -> dict:
    return {
        "run_id": view.run_id,
        "state": view.state.value,
        "status": dumps(view.status()),
        "wake_at": _normal_wake_at(view),
        "driven_by": view.driven_by,
        "agent_def_hash": view.agent_def_hash,
        "graph_hash": view.graph_hash,
        "forked_from": view.forked_from["run_id"] if view.forked_from is not None else None,
        "labels": dumps(view.labels) if view.labels is not None else None,
        "input_tokens": view.input_tokens,
        "output_tokens": view.output_tokens,
        "step_count": view.step_count,
        "event_count": view.next_seq,
        "first_recorded_at": view.first_recorded_at,
        "last_recorded_at": view.last_recorded_at,
        "pending": dumps(view.pending.to_json()) if view.pending is not None else None,
        "view": dumps(view_to_json(view)),
        # Written only by a creating append (an update leaves them out: _MUTABLE_RUN_KEYS).
        "owner_node": None,
        "owner_epoch": 0,
        "owner_driving": 0,
    }


def _first(envelopes: list[Envelope], kind: type) -> Envelope | None:
    return next((e for e in envelopes if isinstance(e.event, kind)), None)


def _claim_rows(
    run_id: str,
    envelopes: list[Envelope],
    recorded_at: str,
    claim: str | None,
    settle: str | None,
    release: str | None,
) -> tuple[dict | None, dict | None, dict | None]:
    """The claims-table rows of an append: the identity it claims, settles or releases.

    Raises:
        ValueError: ``claim`` without a ToolCallRequested, ``settle`` or ``release`` without a
            ToolCallCompleted in the batch, or both ``settle`` and ``release``.
    """
    claim_row = settle_row = release_row = None
    if claim is not None:
        intent = _first(envelopes, ToolCallRequested)
        if intent is None:
            raise ValueError(f"claiming {claim!r} needs a ToolCallRequested in the batch")
        claim_row = {
            "identity": claim,
            "run_id": run_id,
            "seq": intent.seq,
            "state": "open",
            "output": None,
            "updated_at": recorded_at,
        }
    # Looked for only when needed: most appends claim, settle and release nothing.
    completion = (
        None if settle is None and release is None else _first(envelopes, ToolCallCompleted)
    )
    if settle is not None:
        if completion is None:
            raise ValueError(f"settling {settle!r} needs a ToolCallCompleted in the batch")
        settle_row = {
            "w_state": "settled",
            "w_identity": settle,
            "w_run_id": run_id,
            "w_seq": completion.event.seq,
            "w_output": dumps(completion.event.output),
            "w_updated_at": recorded_at,
        }
    if release is not None:
        if completion is None or settle is not None:
            raise ValueError(f"releasing {release!r} needs a ToolCallCompleted and no settle")
        release_row = {
            "w_identity": release,
            "w_run_id": run_id,
            "w_seq": completion.event.seq,
            "w_open": "open",
        }
    return claim_row, settle_row, release_row


def _envelopes(run_id: str, batch: Sequence[Event], start: int, recorded_at: str) -> list[Envelope]:
    """``batch`` as the envelopes it is recorded in, from position ``start`` on."""
    return [
        Envelope(
            run_id=run_id,
            seq=start + offset,
            schema_version=SCHEMA_VERSION,
            recorded_at=recorded_at,
            event=event,
        )
        for offset, event in enumerate(batch)
    ]


def _event_row(envelope: Envelope) -> dict:
    """The events table's row of ``envelope``."""
    return {
        "run_id": envelope.run_id,
        "seq": envelope.seq,
        "kind": envelope.event.KIND.value,
        "schema_version": SCHEMA_VERSION,
        "recorded_at": envelope.recorded_at,
        "payload": encode_payload(envelope.event, seq=envelope.seq),
    }


def prepare(
    run_id: str,
    batch: Sequence[Event],
    view: RunView,
    claim: str | None,
    settle: str | None,
    release: str | None = None,
    *,
    notify: bool = False,
    fence: Fence | None = None,
) -> Prepared:
    """Build the envelopes, let the guard decide, and make the rows.

    ``notify``: also make the outbox row the batch calls for, if any (``notice_of``).
    ``fence``: the driver's; a creating append writes it as the new run's owner (driving it
    unless it is ``Fence.creating``'s).

    Raises:
        GuardRefusal: the batch is not legal after ``view``.
        ValueError: an empty batch, or ``claim``/``settle`` without the event they need.
    """
    if not batch:
        raise ValueError("an append needs at least one event")
    recorded_at = now_instant()
    start = view.next_seq
    envelopes = _envelopes(run_id, batch, start, recorded_at)
    new_view = check_batch(view, envelopes)
    event_rows = [_event_row(envelope) for envelope in envelopes]
    claim_row, settle_row, release_row = _claim_rows(
        run_id, envelopes, recorded_at, claim, settle, release
    )
    run_row = _run_row(new_view)
    if fence is not None and start == 0:
        # Owned from its first event, so no takeover sweep elsewhere can take the run before
        # its first drive.
        run_row.update(
            owner_node=fence.node_id, owner_epoch=fence.epoch, owner_driving=int(fence.driving)
        )
    notice = notice_of(view, envelopes, new_view) if notify else None
    run_row["w_run_id"] = run_id
    run_row["w_event_count"] = start
    return Prepared(
        run_id=run_id,
        envelopes=envelopes,
        view=new_view,
        previous_count=start,
        in_place=new_view.state is view.state and run_row["wake_at"] == _normal_wake_at(view),
        event_rows=event_rows,
        run_row=run_row,
        claim=claim_row,
        settle=settle_row,
        release=release_row,
        notification=None if notice is None else notification_row(notice, new_view, recorded_at),
        fence=fence,
    )


class Writes:
    """The append path's statements, compiled once for one dialect."""

    __slots__ = (
        "insert_claim",
        "insert_events",
        "insert_notification",
        "insert_run",
        "lock_owners",
        "placeholder",
        "release_claim",
        "release_owner",
        "select_claim",
        "settle_claim",
        "update_run",
        "update_run_in_place",
    )

    def __init__(self, dialect: Any) -> None:
        # The fence check reads a varying number of runs: its SQL is made per group, in the
        # driver's own parameter style (``stale_fences``).
        self.placeholder = "?" if dialect.paramstyle == "qmark" else "%s"
        # In run id order, so two groups never wait on each other's rows in a cycle; the rows
        # are locked as the append's update would lock them, so a concurrent claim waits.
        self.lock_owners = (
            " ORDER BY run_id FOR NO KEY UPDATE" if dialect.name == "postgresql" else ""
        )
        self.insert_events = DirectStatement(_INSERT_EVENTS, dialect, keys=_EVENT_KEYS)
        self.insert_run = DirectStatement(_INSERT_RUN, dialect, keys=_RUN_KEYS)
        self.update_run = DirectStatement(_UPDATE_RUN, dialect, keys=_MUTABLE_RUN_KEYS)
        # A batch that leaves state and wake_at as they were (a call and its
        # completion) does not touch the indexes on them.
        self.update_run_in_place = DirectStatement(
            _UPDATE_RUN, dialect, keys=_MUTABLE_RUN_KEYS[len(_PLACE_KEYS) :]
        )
        self.insert_claim = DirectStatement(_INSERT_CLAIM, dialect, keys=_CLAIM_KEYS)
        self.settle_claim = DirectStatement(_SETTLE_CLAIM, dialect)
        self.release_claim = DirectStatement(_RELEASE_CLAIM, dialect)
        self.release_owner = DirectStatement(_RELEASE_OWNER, dialect)
        self.select_claim = DirectStatement(SELECT_CLAIM, dialect)
        self.insert_notification = DirectStatement(
            _INSERT_NOTIFICATION, dialect, keys=_NOTIFICATION_KEYS
        )


def stale_fences(cursor: Any, writes: Writes, batch: list[Prepared]) -> dict[int, Fenced]:
    """The fenced appends of ``batch`` whose run another fence owns now, by position in
    ``batch``; read inside the append's transaction, before anything is written. On PostgreSQL
    the runs rows stay locked to the commit, so a claim racing the append either committed
    first (and is seen here) or waits for it. A creating append is not checked: its insert
    conflicts with any row already there."""
    checked = {
        position: prepared
        for position, prepared in enumerate(batch)
        if prepared.fence is not None and prepared.previous_count > 0
    }
    if not checked:
        return {}
    run_ids = sorted({prepared.run_id for prepared in checked.values()})
    marks = ", ".join([writes.placeholder] * len(run_ids))
    cursor.execute(
        f"SELECT run_id, owner_node, owner_epoch FROM runs WHERE run_id IN ({marks})"
        + writes.lock_owners,
        tuple(run_ids),
    )
    held = {run_id: (node, epoch) for run_id, node, epoch in cursor.fetchall()}
    fenced = {}
    for position, prepared in checked.items():
        fence = prepared.fence
        # A run with no row: its update matches nothing and the append is a SeqConflict.
        node, epoch = held.get(prepared.run_id, (fence.node_id, fence.epoch))
        if node != fence.node_id or epoch != fence.epoch:
            owner = f"node {node} at epoch {epoch}" if node else f"no node (epoch {epoch})"
            fenced[position] = Fenced(
                f"run {prepared.run_id} was taken from node {fence.node_id} (its epoch "
                f"{fence.epoch}); the store's owner is {owner}, so nothing of this append "
                "was written",
                run_id=prepared.run_id,
                epoch=fence.epoch,
                owner_node=node,
                owner_epoch=epoch,
            )
    return fenced


def release_owners(cursor: Any, writes: Writes, releases: Sequence[OwnerRelease]) -> None:
    """Let each run of ``releases`` go (``RunOwners.release``), inside a transaction the caller
    owns; a stale fence matches nothing."""
    if releases:
        writes.release_owner.executemany(
            cursor,
            [
                {"o_run_id": r.run_id, "o_node_id": r.fence.node_id, "o_epoch": r.fence.epoch}
                for r in releases
            ],
        )


def append_txn(cursor: Any, writes: Writes, integrity_error: type, prepared: Prepared) -> None:
    """The body of an append, inside a transaction the caller owns.

    Raises:
        SeqConflict: another writer got to one of these seqs first.
        IdentityTaken: the claim (or the claim being settled) belongs to someone else.
    """
    if prepared.claim is not None:
        try:
            writes.insert_claim.execute(cursor, prepared.claim)
        except integrity_error:
            raise IdentityTaken(prepared.claim["identity"]) from None
    try:
        writes.insert_events.executemany(cursor, prepared.event_rows)
    except integrity_error:
        raise _seq_conflict(prepared) from None
    if prepared.previous_count == 0:
        try:
            writes.insert_run.execute(cursor, prepared.run_row)
        except integrity_error:
            raise _seq_conflict(prepared) from None
    else:
        statement = writes.update_run_in_place if prepared.in_place else writes.update_run
        if statement.execute(cursor, prepared.run_row).rowcount != 1:
            raise _seq_conflict(prepared)
    settle = prepared.settle
    if settle is not None and writes.settle_claim.execute(cursor, settle).rowcount != 1:
        _settle_unclaimed(cursor, writes, settle)
    if prepared.release is not None:
        # Nothing to release (never claimed, or not this intent's) is not an error.
        writes.release_claim.execute(cursor, prepared.release)
    if prepared.notification is not None:
        writes.insert_notification.execute(cursor, prepared.notification)


def append_group(cursor: Any, writes: Writes, integrity_error: type, batch: list[Prepared]) -> None:
    """Many appends inside one transaction with one statement per kind of write.

    The same rows as ``append_txn`` for each append in turn, but every
    event of the group goes in one ``executemany``, and so do the runs rows
    (new runs, then the moved ones, then those updated in place): a handful
    of driver calls (and, on a server, round trips) per group instead of two
    or more per append, the group's outbox rows last. For appends without a
    claim, a settlement or a release.

    Raises:
        SeqConflict: some append of the group lost its seq to another writer,
            or the driver could not say how many runs rows it updated; the
            caller rolls back and commits the appends one by one, so each
            learns its own outcome.
    """
    try:
        writes.insert_events.executemany(
            cursor, [row for prepared in batch for row in prepared.event_rows]
        )
        created = [prepared.run_row for prepared in batch if prepared.previous_count == 0]
        if created:
            writes.insert_run.executemany(cursor, created)
    except integrity_error:
        raise _group_conflict(batch) from None
    for statement, in_place in ((writes.update_run, False), (writes.update_run_in_place, True)):
        rows = [p.run_row for p in batch if p.previous_count != 0 and p.in_place is in_place]
        # A runs row moved on by someone else matches nothing: fewer rows than appends.
        if rows and statement.executemany(cursor, rows) != len(rows):
            raise _group_conflict(batch)
    outbox = [p.notification for p in batch if p.notification is not None]
    if outbox:
        # Its seq is one of the group's own events, inserted above: a conflict here cannot be.
        writes.insert_notification.executemany(cursor, outbox)


def _group_conflict(batch: list[Prepared]) -> SeqConflict:
    runs = sorted({prepared.run_id for prepared in batch})
    return SeqConflict(
        f"an append of the group for runs {', '.join(runs)} lost its seq to another writer; "
        "nothing of the group was written"
    )


def _settle_unclaimed(cursor: Any, writes: Writes, settle: dict) -> None:
    # Not settled by the update: either someone else holds the identity, or
    # it was never claimed (an intent recorded before its tool declared a
    # key). Recording the outcome of the latter is still right.
    identity = settle["w_identity"]
    if writes.select_claim.execute(cursor, {"identity": identity}).fetchone() is not None:
        raise IdentityTaken(identity)
    writes.insert_claim.execute(
        cursor,
        {
            "identity": identity,
            "run_id": settle["w_run_id"],
            "seq": settle["w_seq"],
            "state": "settled",
            "output": settle["w_output"],
            "updated_at": settle["w_updated_at"],
        },
    )


def _seq_conflict(prepared: Prepared) -> SeqConflict:
    first, last = prepared.envelopes[0].seq, prepared.envelopes[-1].seq
    span = f"seq {first}" if first == last else f"seqs {first}-{last}"
    return SeqConflict(
        f"run {prepared.run_id} already has events at {span} or moved past seq {first} "
        "(another writer appended first); nothing was written, re-read its view and retry"
    )
