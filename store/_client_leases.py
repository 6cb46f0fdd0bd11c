"""Drive-token leases on client-driven runs, in the store: one row per run holding its current
token's digest and when the lease lapses, on the store's own clock.

Rules of this module:

* A drive token is a secret: only its SHA-256 digest is written, and the caller compares
  digests (in constant time). Nothing here sees a token.
* A lease is current while ``expires_at`` is after the store's clock now; a lapsed row is as
  good as none (``take`` writes over it, ``sweep`` removes the ones nobody re-opens).
* Each change is one statement whose condition re-checks what it depends on, so two nodes
  racing on one run never both hold it: of two ``take``s only one finds the lease free.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from salvor.protocol import parse_instant
from sqlalchemy import Engine, delete, select, update

from ._db_clock import db_after, db_now
from ._repository import Repository
from ._schema import client_leases

# Runs per query when asking which hold a lease (within both databases' parameter limits).
_PAGE = 400


@dataclass(frozen=True, slots=True)
class ClientLease:
    """A current lease: its token's digest, what its open said of keeping model request bodies,
    and the seconds left before it lapses (by the store's clock)."""

    token_digest: str
    record_prompts: bool
    seconds_left: float


class ClientLeases(Repository):
    """The ``client_leases`` table."""

    def __init__(self, engine: Engine, url: str) -> None:
        super().__init__(engine, url)
        self._now = db_now(self.dialect)
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        self._insert = insert

    def current(self, run_id: str) -> ClientLease | None:
        """The run's lease, None when there is none or it lapsed.

        Raises:
            StoreUnavailable: the database failed.
        """
        statement = select(
            client_leases.c.token_digest,
            client_leases.c.record_prompts,
            client_leases.c.expires_at,
            self._now.label("now"),
        ).where(client_leases.c.run_id == run_id)
        with self._reading("read a client run's lease") as connection:
            row = connection.execute(statement).first()
        if row is None or row.expires_at <= row.now:
            return None
        left = (parse_instant(row.expires_at) - parse_instant(row.now)).total_seconds()
        return ClientLease(row.token_digest, bool(row.record_prompts), left)

    def holding(self, run_ids: Collection[str]) -> set[str]:
        """Which of ``run_ids`` hold a current lease.

        Raises:
            StoreUnavailable: the database failed.
        """
        wanted = sorted(set(run_ids))
        held: set[str] = set()
        with self._reading("read client runs' leases") as connection:
            for start in range(0, len(wanted), _PAGE):
                statement = select(client_leases.c.run_id).where(
                    client_leases.c.run_id.in_(wanted[start : start + _PAGE]),
                    client_leases.c.expires_at > self._now,
                )
                held.update(connection.execute(statement).scalars())
        return held

    def take(
        self,
        run_id: str,
        token_digest: str,
        *,
        ttl: float,
        record_prompts: bool,
        over_current: bool = False,
    ) -> bool:
        """Give the run a new lease under ``token_digest`` for ``ttl`` seconds, if it has none
        current (any current one is replaced when ``over_current``); whether it was given.

        Raises:
            StoreUnavailable: the database failed; the run's lease is as it was.
        """
        dialect = self.dialect
        statement = self._insert(client_leases).values(
            run_id=run_id,
            token_digest=token_digest,
            record_prompts=int(record_prompts),
            opened_at=self._now,
            expires_at=db_after(dialect, ttl),
        )
        statement = statement.on_conflict_do_update(
            index_elements=[client_leases.c.run_id],
            set_={
                "token_digest": statement.excluded.token_digest,
                "record_prompts": statement.excluded.record_prompts,
                "opened_at": statement.excluded.opened_at,
                "expires_at": statement.excluded.expires_at,
            },
            where=None if over_current else client_leases.c.expires_at <= self._now,
        ).returning(client_leases.c.run_id)
        # RETURNING, not the row count: a driver may not count an upsert's rows.
        with self._writing("open a client run's lease") as connection:
            return connection.execute(statement).first() is not None

    def refresh(self, run_id: str, token_digest: str, *, ttl: float) -> bool:
        """Make the lease under ``token_digest`` last ``ttl`` seconds from now, if it is still
        the current one; whether it was.

        Raises:
            StoreUnavailable: the database failed; the lease is as it was.
        """
        statement = (
            update(client_leases)
            .where(
                client_leases.c.run_id == run_id,
                client_leases.c.token_digest == token_digest,
                client_leases.c.expires_at > self._now,
            )
            .values(expires_at=db_after(self.dialect, ttl))
        )
        with self._writing("refresh a client run's lease") as connection:
            return connection.execute(statement).rowcount == 1

    def end(self, run_id: str, token_digest: str | None = None) -> bool:
        """End the run's lease (only the one under ``token_digest``, when given); whether a
        current one ended.

        Raises:
            StoreUnavailable: the database failed; the lease is as it was.
        """
        statement = delete(client_leases).where(
            client_leases.c.run_id == run_id, client_leases.c.expires_at > self._now
        )
        if token_digest is not None:
            statement = statement.where(client_leases.c.token_digest == token_digest)
        with self._writing("end a client run's lease") as connection:
            return connection.execute(statement).rowcount == 1

    def sweep(self) -> int:
        """Remove lapsed leases; how many.

        Raises:
            StoreUnavailable: the database failed; nothing was removed.
        """
        statement = delete(client_leases).where(client_leases.c.expires_at <= self._now)
        with self._writing("sweep lapsed client run leases") as connection:
            return connection.execute(statement).rowcount
