"""The operator's notification outbox: reading it, claiming due rows, and marking how each
delivery went.

Rules of this module:

* A due row is delivered by one node at a time: ``claim_due`` takes due rows nobody holds (or
  whose holder's claim ran out) and marks them with the claimer and a deadline on the store's
  own clock, in one transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so two claimers
  never wait on each other's rows; ``BEGIN IMMEDIATE`` on SQLite, which takes them one at a
  time). A claimer that dies leaves its rows claimable again once their deadline passes: the
  delivery stays at least once.
* Whether a row is due is read against the deliverer's clock (``now``, as its next attempt
  was written); claims against the store's.
* Every write is a transaction of its own; a failed one leaves the row as it was.

What each append writes into the outbox is decided in ``_notifications`` (pure).
"""

from __future__ import annotations

from datetime import datetime

from salvor.protocol import format_instant, parse_instant
from sqlalchemy import Engine, bindparam, case, delete, func, or_, select, text, update

from ._append_rows import now_instant
from ._db_clock import db_after, db_now
from ._records import Notification, notification_from_row
from ._repository import Repository
from ._schema import notifications

# Literal condition, so both planners read ix_notifications_due (a partial index) in its order.
_UNDELIVERED = text("delivered_at IS NULL")
_DUE = (
    select(*notifications.c)
    .where(_UNDELIVERED, notifications.c.next_attempt_at <= bindparam("now"))
    .order_by(notifications.c.next_attempt_at, notifications.c.id)
    .limit(bindparam("limit"))
)
# A row held by a claim comes due for anyone else when the claim runs out.
_NEXT_DUE = select(
    func.min(
        case(
            (
                notifications.c.claimed_until > notifications.c.next_attempt_at,
                notifications.c.claimed_until,
            ),
            else_=notifications.c.next_attempt_at,
        )
    )
).where(_UNDELIVERED)


class Outbox(Repository):
    """The ``notifications`` table: what the operator is still to be told."""

    def __init__(self, engine: Engine, url: str) -> None:
        super().__init__(engine, url)
        now = db_now(self.dialect)
        free = or_(notifications.c.claimed_until.is_(None), notifications.c.claimed_until <= now)
        claimable = (
            select(notifications.c.id)
            .where(_UNDELIVERED, notifications.c.next_attempt_at <= bindparam("now"), free)
            .order_by(notifications.c.next_attempt_at, notifications.c.id)
            .limit(bindparam("limit"))
        )
        if self.dialect == "postgresql":
            # Rows another claimer has locked are passed over, not waited for.
            claimable = claimable.with_for_update(skip_locked=True)
        self._claimable = claimable

    def due(self, now: datetime, *, limit: int = 50) -> list[Notification]:
        """Undelivered notifications due at or before ``now``, the longest due first, at most
        ``limit`` (the oldest of equally due ones first), claimed or not.

        Raises:
            StoreUnavailable: the database failed.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        params = {"now": format_instant(now), "limit": limit}
        with self._reading("read due notifications") as connection:
            return [notification_from_row(r) for r in connection.execute(_DUE, params)]

    def claim_due(
        self, node: str, now: datetime, *, hold_seconds: float, limit: int = 50
    ) -> list[Notification]:
        """Claim for ``node`` up to ``limit`` notifications due at or before ``now`` that no
        claim holds, the longest due first; each is held for ``hold_seconds`` of the store's
        clock, during which no other claimer is given it.

        Raises:
            StoreUnavailable: the database failed; nothing was claimed.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        params = {"now": format_instant(now), "limit": limit}
        with self._writing("claim due notifications") as connection:
            ids = list(connection.execute(self._claimable, params).scalars())
            if not ids:
                return []
            connection.execute(
                update(notifications)
                .where(notifications.c.id.in_(ids))
                .values(claimed_by=node, claimed_until=db_after(self.dialect, hold_seconds))
            )
            rows = connection.execute(
                select(*notifications.c)
                .where(notifications.c.id.in_(ids))
                .order_by(notifications.c.next_attempt_at, notifications.c.id)
            )
            return [notification_from_row(row) for row in rows]

    def next_due(self) -> datetime | None:
        """When the soonest undelivered notification is due (for a claimed one, when its claim
        runs out if that is later); None when every one is delivered.

        Raises:
            StoreUnavailable: the database failed.
        """
        with self._reading("read the outbox") as connection:
            due = connection.execute(_NEXT_DUE).scalar_one_or_none()
        return None if due is None else parse_instant(due)

    def entries(self, run_id: str | None = None) -> list[Notification]:
        """Every notification (of ``run_id`` when given), delivered or not, in the order written."""
        statement = select(*notifications.c).order_by(notifications.c.id)
        if run_id is not None:
            statement = statement.where(notifications.c.run_id == run_id)
        with self._reading("list notifications") as connection:
            return [notification_from_row(row) for row in connection.execute(statement)]

    def mark_delivered(self, notification_id: int) -> None:
        """Record that notification ``notification_id`` was delivered (now); it is never due again.
        Its claimer stays recorded as who delivered it.

        Raises:
            StoreUnavailable: the database failed; the row is as it was (still due).
        """
        self._execute(
            update(notifications)
            .where(notifications.c.id == notification_id)
            .values(delivered_at=now_instant(), claimed_until=None),
            "mark a notification delivered",
        )

    def failed(
        self, notification_id: int, next_attempt_at: datetime, *, node: str | None = None
    ) -> None:
        """Count a failed delivery of ``notification_id``, make it due again at
        ``next_attempt_at`` and let its claim go. With ``node``, only while that node's claim
        holds it (a claim that ran out and was taken by another is the other's now).

        Raises:
            StoreUnavailable: the database failed; the row is as it was (due as before).
        """
        self._execute(
            self._claimed(notification_id, node).values(
                attempts=notifications.c.attempts + 1,
                next_attempt_at=format_instant(next_attempt_at),
                claimed_by=None,
                claimed_until=None,
            ),
            "record a failed notification",
        )

    def postpone(self, notification_id: int, until: datetime, *, node: str | None = None) -> None:
        """Make ``notification_id`` due at ``until`` without counting an attempt (it was not
        sent: its moment has not come yet), and let its claim go (``node``: as ``failed``).

        Raises:
            StoreUnavailable: the database failed; the row is as it was.
        """
        self._execute(
            self._claimed(notification_id, node).values(
                next_attempt_at=format_instant(until), claimed_by=None, claimed_until=None
            ),
            "postpone a notification",
        )

    def release(self, node: str) -> int:
        """Let go of every undelivered row ``node`` holds (it stops delivering): each is due for
        anyone as it was before the claim. How many.

        Raises:
            StoreUnavailable: the database failed; the claims stand until they run out.
        """
        statement = (
            update(notifications)
            .where(_UNDELIVERED, notifications.c.claimed_by == node)
            .values(claimed_by=None, claimed_until=None)
        )
        with self._writing("let go of claimed notifications") as connection:
            return connection.execute(statement).rowcount

    def withdraw(self, notification_id: int) -> None:
        """Remove ``notification_id`` unsent: what it would announce did not come to be (a write
        whose outcome turned out known before anyone had to be told).

        Raises:
            StoreUnavailable: the database failed; the row is as it was.
        """
        self._execute(
            delete(notifications).where(notifications.c.id == notification_id),
            "withdraw a notification",
        )

    @staticmethod
    def _claimed(notification_id: int, node: str | None):
        statement = update(notifications).where(notifications.c.id == notification_id)
        if node is not None:
            statement = statement.where(notifications.c.claimed_by == node)
        return statement

    def _execute(self, statement, doing: str) -> None:
        with self._writing(doing) as connection:
            connection.execute(statement)
