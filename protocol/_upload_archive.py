"""An uploaded flow member: one gzipped tar holding exactly one regular file, the member's bytes.

A client sends a member too big for the call body to ``POST /v1/uploads`` packed so
(``pack_upload``); the daemon checks the archive when it is sent and unpacks it when a call names
it (``unpack_upload``).

Rules:
* The archive and the file inside are each at most ``MAX_UPLOAD_BYTES``; unpacking stops reading
  at the first header past the cap, so a small archive that inflates to more is refused without
  inflating it.
* Anything but one regular file is refused: a link, a directory, a device, a second entry, a
  name that is absolute or has a ``..`` segment.
Pure: bytes in, bytes out; nothing here touches a file.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import posixpath
import tarfile
import zlib

from ._flow_bundle import MAX_MEMBER_BYTES

# One archive as sent, and the file inside it.
MAX_UPLOAD_BYTES = MAX_MEMBER_BYTES


class BadArchive(ValueError):
    """Bytes that are not an upload this daemon takes; the message says why."""


def archive_hash(archive: bytes) -> str:
    """The SHA-256 of an archive as sent, lowercase hex (what names it beside its upload id)."""
    return hashlib.sha256(archive).hexdigest()


def pack_upload(name: str, data: bytes) -> bytes:
    """``data`` as the one regular file ``name`` (a plain file name) of a gzipped tar."""
    info = tarfile.TarInfo(posixpath.basename(name) or "member")
    info.size = len(data)
    info.mode = 0o644
    buffer = io.BytesIO()
    # mtime 0: the same bytes pack to the same archive.
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _safe_name(name: str) -> bool:
    return bool(name) and not name.startswith("/") and ".." not in name.split("/")


def unpack_upload(archive: bytes) -> bytes:
    """The one file of an upload.

    Raises:
        BadArchive: it is not a gzipped tar of exactly one regular file within the caps.
    """
    if len(archive) > MAX_UPLOAD_BYTES:
        raise BadArchive(f"the archive is {len(archive)} bytes, over the 32 MiB cap")
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            first = tar.next()
            if first is None:
                raise BadArchive("the archive holds no file")
            _check_entry(first)
            handle = tar.extractfile(first)
            data = b"" if handle is None else handle.read()
            if tar.next() is not None:
                raise BadArchive("the archive holds more than one entry; an upload is one file")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise BadArchive(f"the body is not a gzipped tar ({exc})") from None
    if len(data) != first.size:
        raise BadArchive("the archive ends inside its file")
    return data


def _check_entry(entry: tarfile.TarInfo) -> None:
    if not _safe_name(entry.name):
        raise BadArchive(f"the archive's entry {entry.name!r} is not a plain relative name")
    if not entry.isreg():
        kind = (
            "a link"
            if entry.issym() or entry.islnk()
            else "a directory"
            if entry.isdir()
            else ("not a regular file")
        )
        raise BadArchive(f"the archive's entry {entry.name!r} is {kind}; an upload is one file")
    if entry.size > MAX_UPLOAD_BYTES:
        raise BadArchive(f"the archive's file is {entry.size} bytes, over the 32 MiB cap")
