"""Flow members a client sends ahead of its call (``POST /v1/uploads``), kept in the store so
whichever node the call reaches holds them, and spent by the one call that names them.

Unpacking and hashing are work for a thread (an archive is up to 32 MiB), as is every store
call; nothing here blocks the trio thread.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Collection

import trio
from salvor.protocol import (
    MAX_CALL_BYTES,
    BadArchive,
    ErrorCode,
    SentUpload,
    archive_hash,
    unpack_upload,
)
from salvor.store import StoreUnavailable

from ..recording import StoreAccess
from ..web import OperationRefused

log = logging.getLogger("salvor.runs")

# How often an upload also sweeps (besides the wake sweeper's pass, which may be off).
SWEEP_EVERY_SECONDS = 60.0
# What one archive may add to its file's bytes (tar headers, gzip framing): the uploads of one
# call are read only while their archives stay within the call's cap plus this much each.
ARCHIVE_OVERHEAD = 64 * 1024


def _refused(message: str) -> OperationRefused:
    return OperationRefused(ErrorCode.INVALID_FLOW_FILES, message)


def _checked(archive: bytes) -> str:
    """The archive's hash once it unpacks to one file (a thread's work)."""
    unpack_upload(archive)
    return archive_hash(archive)


def _unpacked(stored: dict) -> dict[str, SentUpload]:
    """Each taken upload's file (a thread's work), within the call's cap together."""
    sent, total = {}, 0
    for upload_id, upload in stored.items():
        try:
            data = unpack_upload(upload.archive)
        except BadArchive as exc:  # checked when it was sent: only a damaged store says so
            raise _refused(f"upload {upload_id} no longer unpacks: {exc}") from None
        total += len(data)
        if total > MAX_CALL_BYTES:
            raise _refused("the uploads this call names pass the 32 MiB cap on a call's members")
        sent[upload_id] = SentUpload(upload.content_hash, data)
    return sent


class Uploads:
    """Uploads over one store: kept, taken by a call, swept when no call named them in time."""

    def __init__(self, access: StoreAccess) -> None:
        self.access = access
        self._swept_at = -math.inf

    async def keep(self, archive: bytes) -> dict:
        """Check ``archive`` and keep it under a new id; the answer's fields.

        Raises:
            OperationRefused: invalid_flow_files (422) when it is not a gzipped tar of one
                regular file within the caps; nothing was kept.
            StoreUnavailable: the database failed; nothing was kept.
        """
        try:
            digest = await trio.to_thread.run_sync(_checked, archive)
        except BadArchive as exc:
            raise _refused(f"the upload is refused: {exc}") from None
        upload_id = f"upl_{uuid.uuid4().hex}"
        await self.access.read(self.access.store.uploads.put, upload_id, digest, archive)
        if trio.current_time() - self._swept_at >= SWEEP_EVERY_SECONDS:
            await self.sweep()
        return {"upload_id": upload_id, "content_hash": digest, "size": len(archive)}

    async def take(self, upload_ids: Collection[str]) -> dict[str, SentUpload]:
        """Delete every upload of ``upload_ids`` and return the files of those held, by id
        (an id held nowhere is simply absent: the call's members say what they needed).

        Raises:
            OperationRefused: invalid_flow_files (422) when the held uploads pass the call's
                cap together; they are deleted all the same.
            StoreUnavailable: the database failed; nothing was deleted.
        """
        if not upload_ids:
            return {}
        budget = MAX_CALL_BYTES + ARCHIVE_OVERHEAD * len(upload_ids)
        take = self.access.store.uploads.take
        stored = await self.access.read(take, upload_ids, budget=budget)
        if stored is None:
            raise _refused("the uploads this call names pass the 32 MiB cap on a call's members")
        return await trio.to_thread.run_sync(_unpacked, stored)

    async def discard(self, upload_ids: Collection[str]) -> None:
        """Delete every upload of ``upload_ids``, unread (a call refused before it read them)."""
        if upload_ids:
            await self.access.read(self.access.store.uploads.take, upload_ids, budget=-1)

    async def sweep(self) -> int:
        """Delete the uploads no call named within the hour (``store.uploads.sweep``); how
        many. A store failure is logged and the uploads are left to the next sweep."""
        self._swept_at = trio.current_time()
        try:
            swept = await self.access.read(self.access.store.uploads.sweep)
        except StoreUnavailable as exc:
            log.warning("the upload sweep failed (%s); trying again at the next", exc)
            return 0
        if swept:
            log.info("swept %d uploads no call named within the hour", swept)
        return swept
