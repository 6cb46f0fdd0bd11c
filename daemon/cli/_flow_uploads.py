"""The body of a flow's call to a daemon: members inline until they are ``INLINE_BYTES`` together,
each further one sent ahead to ``POST /v1/uploads`` and named in the call.

A reverse proxy's body limit then applies to the flow file with up to 256 KiB of members, and to
one member at a time. The order is the call's (the flow file, then the members by key), so the
same files always split the same way, and ``SALVOR_FLOW_FILES_LOG=1`` says beforehand which way
each goes (``placements``). An upload is good for the one call that names it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

import httpx
import trio
from salvor.protocol import (
    MAX_UPLOAD_BYTES,
    FlowBundle,
    archive_hash,
    call_body,
    pack_upload,
)

from ._errors import CliError

# The members' bytes a call carries inline; past this, each further member goes by upload.
INLINE_BYTES = 256 * 1024
UPLOADS_PATH = "/v1/uploads"


def placements(bundle: FlowBundle, contents: Mapping[str, bytes]) -> dict[str, bool]:
    """Whether each file with bytes goes by upload, by digest, in the call's order: the flow
    file by upload only when it alone passes ``INLINE_BYTES``; the members by key, inline while
    their total stays within ``INLINE_BYTES``, and from the first that would pass it on, each
    by upload (bytes sent once for several members travel one way)."""
    uploaded = {bundle.document: len(contents[bundle.document]) > INLINE_BYTES}
    total, spilled = 0, False
    for key in sorted(bundle.members):
        digest = bundle.members[key].sha256
        data = None if digest is None else contents.get(digest)
        if data is None:
            continue
        if digest not in uploaded:
            spilled = spilled or total + len(data) > INLINE_BYTES
            uploaded[digest] = spilled
        if not uploaded[digest]:
            total += len(data)
    return uploaded


def _names(bundle: FlowBundle) -> dict[str, str]:
    """A file name for each digest, for its archive's one entry (the client's own name)."""
    names = {bundle.document: posixpath.basename(bundle.canonical)}
    for key in sorted(bundle.members):
        member = bundle.members[key]
        if member.sha256 is not None:
            names.setdefault(member.sha256, posixpath.basename(member.canonical))
    return names


def _shown(client: httpx.AsyncClient) -> str:
    return str(client.base_url).rstrip("/")


def _proxy_refused(client: httpx.AsyncClient, size: int, name: str) -> CliError:
    return CliError(
        f"a proxy in front of {_shown(client)} refused the {size}-byte upload of {name} with "
        f"413 Payload Too Large, so the flow was not sent: it must accept request bodies of up "
        f"to 32 MiB ({MAX_UPLOAD_BYTES} bytes) on POST {UPLOADS_PATH} (nginx: "
        f"`client_max_body_size 32m;` in a `location = {UPLOADS_PATH}` block)"
    )


def _daemon_error(response: httpx.Response) -> str | None:
    """The message of the daemon's own error envelope, None for anything else (a proxy's)."""
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


async def _upload(client: httpx.AsyncClient, name: str, data: bytes) -> dict:
    """Send ``data`` as one upload; the fields naming it in the call.

    Raises:
        CliError: the upload was refused (by a proxy's body limit: the sentence names the size it
            must take) or the daemon could not be reached; no call was sent.
    """
    archive = await trio.to_thread.run_sync(pack_upload, name, data)
    if len(archive) > MAX_UPLOAD_BYTES:
        raise CliError(
            f"{name} packs to {len(archive)} bytes, over the 32 MiB an upload may be, so the "
            "flow was not sent"
        )
    try:
        response = await client.post(
            UPLOADS_PATH, content=archive, headers={"Content-Type": "application/gzip"}
        )
    except httpx.HTTPError as exc:
        raise CliError(
            f"the upload of {name} to {_shown(client)} failed ({exc or type(exc).__name__}), "
            "so the flow was not sent"
        ) from None
    message = _daemon_error(response)
    if response.status_code == 413 and message is None:
        raise _proxy_refused(client, len(archive), name)
    if response.status_code != 201:
        why = message or f"HTTP {response.status_code}"
        raise CliError(f"the daemon refused the upload of {name} ({why}), so the flow was not sent")
    answer = response.json()
    if answer.get("content_hash") != archive_hash(archive):
        raise CliError(
            f"the daemon's hash of the upload of {name} is not this client's, so the flow was "
            "not sent"
        )
    return {"upload_id": answer["upload_id"], "content_hash": answer["content_hash"]}


async def call_with_uploads(
    client: httpx.AsyncClient, bundle: FlowBundle, contents: Mapping[str, bytes]
) -> dict:
    """The ``POST /v1/graph-runs`` body for ``bundle`` (``flow``, ``members``,
    ``update_baselines``), every file ``placements`` sends by upload uploaded first, one after
    another, through ``client`` (its base URL the daemon's).

    Raises:
        CliError: an upload was refused or failed; the call must not be sent (uploads already
            made are left to the daemon's hourly sweep).
    """
    names = _names(bundle)
    uploaded = {}
    for digest, by_upload in placements(bundle, contents).items():
        if by_upload:
            uploaded[digest] = await _upload(client, names[digest], contents[digest])
    return call_body(bundle, dict(contents), uploaded)
