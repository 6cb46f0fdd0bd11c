"""``POST /v1/uploads``: a flow member sent ahead of the call that names it.

A client sends a member that does not fit the call body (past the first 256 KiB of a flow's
members) as one gzipped tar of that one file; the daemon checks it, keeps it in the store (so
whichever node the call reaches holds it) and answers its id and the archive's hash, which the
call's member names beside the file's size. The call spends it: an upload is good for one call,
and one no call named within an hour is swept.
"""

from __future__ import annotations

from quart import request
from quart_trio import QuartTrio
from salvor.protocol import MAX_UPLOAD_BYTES, ErrorCode

from ..web import OperationRefused, media_type, read_body, unsupported_media_type
from ._http import json_response
from ._operation import Operation, error, route
from ._state import ServerState

# The media types an upload is taken as (the second is an older name of the first).
GZIP_TYPES = ("application/gzip", "application/x-gzip")

UPLOAD_KEPT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["upload_id", "content_hash", "size"],
    "properties": {
        "upload_id": {
            "type": "string",
            "pattern": "^upl_[0-9a-f]{32}$",
            "description": "Names the upload in the one call that spends it.",
        },
        "content_hash": {
            "type": "string",
            "pattern": "^[0-9a-f]{64}$",
            "description": "The SHA-256 of the archive as sent (hex); the call names it too.",
        },
        "size": {"type": "integer", "minimum": 0, "description": "The archive's bytes."},
    },
}

UPLOAD = Operation(
    method="post",
    rule="/v1/uploads",
    operation_id="uploadFlowMember",
    new_work=True,
    tag="graphs",
    summary="Send a flow member ahead of the call that names it",
    description=(
        "The body is one gzipped tar holding exactly one regular file, the member's bytes; the "
        "archive and the file are each at most 32 MiB (this route's own cap, above the daemon's "
        "payload limit). The upload is kept in the store, so any node over it can serve the "
        "`POST /v1/graph-runs` whose member (or flow file) names it by `upload_id` and "
        "`content_hash`, with `size` the file's size. That call deletes it, whether it starts "
        "a run or is refused; an upload no call named within an hour is deleted."
    ),
    body={
        "required": True,
        "content": {
            "application/gzip": {
                "schema": {"type": "string", "format": "binary", "maxLength": MAX_UPLOAD_BYTES}
            }
        },
    },
    answers={"201": ("The upload is kept; name it in one call within an hour.", UPLOAD_KEPT)},
    refusals=("PayloadTooLarge",),
    responses={
        "422": error(
            "The body is not a gzipped tar of exactly one regular file (a link, a directory, a "
            "second entry, an absolute name or one with `..`), or its file is over 32 MiB. "
            "Nothing kept.",
            "invalid_flow_files",
        ),
    },
)
OPERATIONS = (UPLOAD,)


async def _archive(timeout: float | None) -> bytes:
    """The request's body under this route's own cap (32 MiB).

    Raises:
        OperationRefused: unsupported_media_type (415) unless sent as gzip, payload_too_large
            (413) past the cap, request_timeout (408).
    """
    sent = media_type(request.headers.get("Content-Type"))
    if sent not in GZIP_TYPES:
        shown = f"as {sent}" if sent else "without a Content-Type"
        raise unsupported_media_type(
            f"an upload is sent with `Content-Type: application/gzip`; this one was sent {shown}"
        )
    try:
        return await read_body(request.body, timeout, cap=MAX_UPLOAD_BYTES, payload_limit=False)
    except OperationRefused as exc:
        if exc.code is not ErrorCode.PAYLOAD_TOO_LARGE:
            raise
        raise OperationRefused(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"an upload may be at most {MAX_UPLOAD_BYTES} bytes (32 MiB); this body is over it",
            details={"limit": "upload_bytes", "value": MAX_UPLOAD_BYTES},
        ) from None


def add_upload_routes(app: QuartTrio, state: ServerState) -> None:
    uploads = state.runtime.uploads

    @route(app, UPLOAD)
    async def upload_flow_member():
        archive = await _archive(request.body_timeout)
        kept = await uploads.keep(archive)
        return json_response(kept, 201)
