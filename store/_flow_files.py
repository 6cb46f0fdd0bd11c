"""The files of flow runs, content-addressed (``store.flow_files``): a member's bytes or a
bundle's manifest under ``sha256:<hex>`` of its bytes.

A row is written once and never changed: a second ``put`` of the same digest keeps the first.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from ._append_rows import now_instant
from ._repository import Repository
from ._schema import flow_files


def file_digest(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


class KeptFlowFiles(Repository):
    """The ``flow_files`` table (``store.flow_files``): the bytes a flow run was given, kept
    by digest (what ``daemon.graphs.FlowFiles`` reads a bundle's members from)."""

    def put(self, contents: dict[str, bytes]) -> None:
        """Keep each ``digest -> bytes`` not yet kept, in one transaction.

        Raises:
            ValueError: a digest is not the one of its bytes; nothing was written.
            StoreUnavailable: the database failed; nothing was written.
        """
        for digest, content in contents.items():
            if file_digest(content) != digest:
                raise ValueError(f"{digest} is not the digest of the bytes given for it")
        if not contents:
            return
        with self._reading("read flow files") as connection:
            have = set(
                connection.execute(
                    select(flow_files.c.sha256).where(flow_files.c.sha256.in_(list(contents)))
                ).scalars()
            )
        rows = [
            {"sha256": digest, "content": content, "created_at": now_instant()}
            for digest, content in contents.items()
            if digest not in have
        ]
        for row in rows:
            try:
                with self._engine.begin() as connection:
                    connection.execute(insert(flow_files), row)
            except IntegrityError:
                continue  # a racing writer kept the same bytes first
            except SQLAlchemyError as exc:
                raise self._failed(exc, "keep a flow file") from None

    def get(self, digest: str) -> bytes | None:
        """The bytes kept under ``digest``, or None.

        Raises:
            StoreUnavailable: the database failed.
        """
        with self._reading("read a flow file") as connection:
            row = connection.execute(
                select(flow_files.c.content).where(flow_files.c.sha256 == digest)
            ).first()
        return None if row is None else bytes(row[0])
