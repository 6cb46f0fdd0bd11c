"""Flow members sent ahead of their call (``store.uploads``): each archive as a client sent it,
under an id the daemon gave it, until one call names it or it has waited ``UPLOAD_SECONDS``.

Rules of this module:

* An upload is good for one call: ``take`` deletes what it returns, in one statement, so of two
  calls naming the same upload (on any nodes) one gets it and the other finds nothing.
* Ages are read on the store's clock, so every node sweeps the same uploads; ``sweep`` is one
  conditional delete, so nodes sweeping together each remove what is left and none twice.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import Engine, delete, func, insert, select

from ._db_clock import db_after, db_now
from ._repository import Repository
from ._schema import uploads

# How long an upload waits for the call that names it; then any node's sweep deletes it.
UPLOAD_SECONDS = 3600.0
# Ids per statement (within both databases' parameter limits).
_PAGE = 400


@dataclass(frozen=True, slots=True)
class StoredUpload:
    """An upload as the store held it: its archive's hash (hex) and the archive."""

    content_hash: str
    archive: bytes


class Uploads(Repository):
    """The ``uploads`` table."""

    def __init__(self, engine: Engine, url: str) -> None:
        super().__init__(engine, url)
        self._now = db_now(self.dialect)

    def put(self, upload_id: str, content_hash: str, archive: bytes) -> None:
        """Keep ``archive`` under ``upload_id`` (a fresh id), aged from the store's clock now.

        Raises:
            StoreUnavailable: the database failed; nothing was kept.
        """
        row = {
            "upload_id": upload_id,
            "content_hash": content_hash,
            "size": len(archive),
            "content": archive,
            "created_at": self._now,
        }
        with self._writing("keep an upload") as connection:
            connection.execute(insert(uploads).values(row))

    def take(self, upload_ids: Collection[str], *, budget: int) -> dict[str, StoredUpload] | None:
        """Delete every upload of ``upload_ids`` and return those this store held, by id; None
        when their archives pass ``budget`` bytes together (deleted all the same, unread).

        Raises:
            StoreUnavailable: the database failed; nothing was deleted.
        """
        wanted = sorted(set(upload_ids))
        taken: dict[str, StoredUpload] = {}
        with self._writing("take uploads") as connection:
            total = 0
            for start in range(0, len(wanted), _PAGE):
                page = wanted[start : start + _PAGE]
                total += connection.execute(
                    select(func.coalesce(func.sum(uploads.c.size), 0)).where(
                        uploads.c.upload_id.in_(page)
                    )
                ).scalar_one()
            for start in range(0, len(wanted), _PAGE):
                statement = delete(uploads).where(
                    uploads.c.upload_id.in_(wanted[start : start + _PAGE])
                )
                if total > budget:
                    connection.execute(statement)
                    continue
                returned = connection.execute(
                    statement.returning(
                        uploads.c.upload_id, uploads.c.content_hash, uploads.c.content
                    )
                )
                for upload_id, content_hash, content in returned:
                    taken[upload_id] = StoredUpload(content_hash, bytes(content))
        return None if total > budget else taken

    def held(self, upload_id: str) -> bool:
        """Whether ``upload_id`` is held (not yet taken nor swept).

        Raises:
            StoreUnavailable: the database failed.
        """
        statement = select(uploads.c.upload_id).where(uploads.c.upload_id == upload_id)
        with self._reading("read an upload") as connection:
            return connection.execute(statement).first() is not None

    def sweep(self, older_than: float = UPLOAD_SECONDS) -> int:
        """Delete the uploads kept ``older_than`` seconds ago or earlier (store's clock); how
        many.

        Raises:
            StoreUnavailable: the database failed; nothing was deleted.
        """
        statement = delete(uploads).where(
            uploads.c.created_at <= db_after(self.dialect, -older_than)
        )
        with self._writing("sweep uploads no call named") as connection:
            return connection.execute(statement).rowcount
