"""The page's login sessions, in the store: one row per live session, so a person logged in
through one node is logged in on every node over this store.

Rules of this module:

* A session id is a secret (the cookie's value): only its SHA-256 digest is written, looked up
  by equality (a digest tells a guesser nothing of how close a guess was).
* A session is live while ``expires_at`` is after the store's clock now; an expired row is as
  good as none, and goes at the next login.
* At most ``capacity`` live at once: a login past it ends the expired ones, then the oldest.
  On PostgreSQL logins take the table's lock in turn, so two nodes logging in together keep
  the bound too.
"""

from __future__ import annotations

from datetime import datetime

from salvor.protocol import parse_instant
from sqlalchemy import Engine, delete, func, insert, select, text

from ._db_clock import db_after, db_now
from ._repository import Repository
from ._schema import login_sessions


class LoginSessions(Repository):
    """The ``sessions`` table."""

    def __init__(self, engine: Engine, url: str) -> None:
        super().__init__(engine, url)
        self._now = db_now(self.dialect)

    def open(self, id_digest: str, *, seconds: float, capacity: int) -> datetime:
        """Record a new session under ``id_digest`` lasting ``seconds``; when it expires.

        Raises:
            StoreUnavailable: the database failed; no session was opened and none ended.
        """
        table = login_sessions
        with self._writing("open a login session") as connection:
            if self.dialect == "postgresql":
                # Readers (``find``) are not held up by this lock, only other logins.
                connection.execute(text("LOCK TABLE sessions IN SHARE ROW EXCLUSIVE MODE"))
            live = connection.execute(select(func.count()).select_from(table)).scalar_one()
            if live >= capacity:
                connection.execute(delete(table).where(table.c.expires_at <= self._now))
                live = connection.execute(select(func.count()).select_from(table)).scalar_one()
            if live >= capacity:
                oldest = (
                    select(table.c.id_digest)
                    .order_by(table.c.created_at, table.c.id_digest)
                    .limit(live - capacity + 1)
                )
                connection.execute(delete(table).where(table.c.id_digest.in_(oldest)))
            connection.execute(
                insert(table).values(
                    id_digest=id_digest,
                    created_at=self._now,
                    expires_at=db_after(self.dialect, seconds),
                )
            )
            expires = connection.execute(
                select(table.c.expires_at).where(table.c.id_digest == id_digest)
            ).scalar_one()
        return parse_instant(expires)

    def find(self, id_digest: str) -> datetime | None:
        """When the live session under ``id_digest`` expires; None for none or an expired one.

        Raises:
            StoreUnavailable: the database failed.
        """
        statement = select(login_sessions.c.expires_at).where(
            login_sessions.c.id_digest == id_digest, login_sessions.c.expires_at > self._now
        )
        with self._reading("read a login session") as connection:
            expires = connection.execute(statement).scalar_one_or_none()
        return None if expires is None else parse_instant(expires)

    def end(self, id_digest: str) -> bool:
        """End the session under ``id_digest``; whether there was a live one.

        Raises:
            StoreUnavailable: the database failed; the session is as it was.
        """
        with self._writing("end a login session") as connection:
            result = connection.execute(
                delete(login_sessions).where(
                    login_sessions.c.id_digest == id_digest,
                    login_sessions.c.expires_at > self._now,
                )
            )
            return result.rowcount == 1

    def count(self) -> int:
        """How many sessions are live now."""
        statement = (
            select(func.count())
            .select_from(login_sessions)
            .where(login_sessions.c.expires_at > self._now)
        )
        with self._reading("count login sessions") as connection:
            return connection.execute(statement).scalar_one()
