"""A flow as a client sends it over a link: the flow file's bytes and its members, each with its
bytes inline (base64) or a state, turned into the bundle a daemon keeps with the run.

Rules (the daemon's side of the call):
* Every member is read before the document. Bytes that do not decode, that disagree with their
  declared ``size``, or that pass 32 MiB for one file or for all the members of the call refuse
  the whole call (``BadFlowBytes``, a 422).
* A member (or the flow file) sent by upload names it with ``upload_id`` and ``content_hash``
  (the archive's SHA-256, hex) beside its ``size``, instead of ``content``. The caller resolves
  the uploads first (``uploads``: what it holds, each unpacked); one it does not hold, a hash that
  differs or a file of another size refuses the call as bad bytes do.
* A member of a role this daemon does not know, or with a key it already has, is skipped; one
  with neither bytes nor a state, or a flow member whose ``canonical`` or spelling is not valid,
  becomes refused, for the pre-check to report against the node that needs it.
* The bundle is marked linked: the pre-check then refuses what would run on the daemon's machine.
Pure: nothing here opens a path; the client's paths are only keys and words in messages.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._flow_bundle import (
    MAX_MEMBER_BYTES,
    MEMBER_ROLES,
    MEMBER_STATES,
    FlowBundle,
    FlowMember,
    MalformedBundle,
    _spelling,
    content_hash,
)

# Every member's bytes in one call, together.
MAX_CALL_BYTES = MAX_MEMBER_BYTES


class BadFlowBytes(ValueError):
    """The call's bytes fail a check; the message names the member (its key) and why."""


@dataclass(frozen=True, slots=True)
class SentUpload:
    """An upload a call names, as the daemon holds it: its archive's hash (hex) and its file."""

    content_hash: str
    data: bytes


def _within_cap(size: Any, where: str) -> None:
    """Refuse a size (declared or found) over the cap on one file; anything else passes."""
    if type(size) is int and size > MAX_MEMBER_BYTES:
        raise BadFlowBytes(f"{where} is {size} bytes, over the 32 MiB cap on one file")


def _sized(data: bytes, size: Any, where: str) -> bytes:
    """``data`` once it is within the cap and of the declared ``size`` (None: none declared)."""
    _within_cap(len(data), where)
    if size is not None and size != len(data):
        raise BadFlowBytes(f"{where} declares {size!r} bytes and its content has {len(data)}")
    return data


def _decoded(value: Any, size: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise BadFlowBytes(f"{where}: content must be base64 text")
    _within_cap(size, where)  # before decoding what is declared too big
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadFlowBytes(f"{where}: content is not valid base64") from None
    return _sized(data, size, where)


def _uploaded(raw: dict, uploads: Mapping[str, SentUpload], where: str) -> bytes:
    upload_id, named_hash, size = raw.get("upload_id"), raw.get("content_hash"), raw.get("size")
    if "content" in raw:
        raise BadFlowBytes(f"{where} carries both content and an upload; send one")
    if type(size) is not int:
        raise BadFlowBytes(f"{where} names an upload without its file's size")
    sent = uploads.get(upload_id) if isinstance(upload_id, str) else None
    if sent is None:
        raise BadFlowBytes(f"{where} names an upload this daemon does not hold ({upload_id!r})")
    if named_hash != sent.content_hash:
        raise BadFlowBytes(f"{where}: content_hash is not the hash of upload {upload_id}")
    return _sized(sent.data, size, where)


def _bytes_of(raw: dict, uploads: Mapping[str, SentUpload], where: str) -> bytes:
    """A member's or the flow file's bytes: inline (base64) or by upload."""
    if "upload_id" in raw:
        return _uploaded(raw, uploads, where)
    return _decoded(raw.get("content"), raw.get("size"), where)


def _text(value: dict, name: str, where: str) -> str:
    text = value.get(name)
    if not isinstance(text, str) or not text:
        raise MalformedBundle(f"{where}.{name} must be a non-empty string")
    return text


def _refused(member: dict, key: str, role: str, where: str, error: str) -> FlowMember:
    return FlowMember(
        key=key,
        role=role,
        path=_text(member, "path", where),
        canonical=member["canonical"] if isinstance(member.get("canonical"), str) else "",
        state="refused",
        error=error,
    )


def _member(
    raw: dict, where: str, contents: dict[str, bytes], uploads: Mapping[str, SentUpload]
) -> FlowMember:
    key, role = _text(raw, "key", where), raw["role"]
    canonical = raw.get("canonical")
    if not isinstance(canonical, str) or not canonical.startswith("/"):
        return _refused(raw, key, role, where, "its canonical path is not an absolute path")
    try:
        spelling = _spelling(raw.get("spelling", {"state": "listed"}), f"{where}.spelling")
    except MalformedBundle as exc:
        return _refused(raw, key, role, where, str(exc))
    path = _text(raw, "path", where)
    if "content" in raw or "upload_id" in raw:
        data = _bytes_of(raw, uploads, f"{where} ({key!r})")
        digest = content_hash(data)
        contents[digest] = data
        return FlowMember(
            key=key,
            role=role,
            path=path,
            canonical=canonical,
            spelling=spelling,
            sha256=digest,
            size=len(data),
        )
    state = raw.get("state")
    if state not in MEMBER_STATES:
        return _refused(raw, key, role, where, "the client sent neither its bytes nor a state")
    error = raw.get("error") if isinstance(raw.get("error"), str) else "refused by the client"
    return FlowMember(
        key=key,
        role=role,
        path=path,
        canonical=canonical,
        spelling=spelling,
        state=state,
        error=error if state == "refused" else None,
    )


def named_uploads(flow: Any, members: Any) -> list[str]:
    """The upload ids a call's ``flow`` and ``members`` name, each once, in order (whatever
    else is wrong with them: every upload a call names is spent by it)."""
    named = [flow] + (members if isinstance(members, list) else [])
    ids = [raw.get("upload_id") for raw in named if isinstance(raw, dict)]
    return list(dict.fromkeys(i for i in ids if isinstance(i, str)))


def flow_from_call(
    flow: Any,
    members: Any,
    *,
    update_baselines: bool = False,
    uploads: Mapping[str, SentUpload] | None = None,
) -> tuple[FlowBundle, dict[str, bytes]]:
    """The linked bundle and the bytes by digest of a flow sent with a call.

    ``uploads``: the uploads the call names that the caller holds, by id (``named_uploads``).

    Raises:
        BadFlowBytes: a member's or the document's bytes fail a check, or name an upload not in
            ``uploads`` or not as it is there (a 422; nothing was kept).
        MalformedBundle: the flow or a member is not the shape (a 400; nothing was kept).
    """
    if not isinstance(flow, dict):
        raise MalformedBundle("flow must be an object")
    if not isinstance(members, list):
        raise MalformedBundle("members must be a list")
    uploads = uploads or {}
    contents: dict[str, bytes] = {}
    kept: dict[str, FlowMember] = {}
    total = 0
    for index, raw in enumerate(members):
        where = f"members[{index}]"
        if not isinstance(raw, dict):
            raise MalformedBundle(f"{where} must be an object")
        if raw.get("role") not in MEMBER_ROLES or raw.get("key") in kept:
            continue  # a role this daemon does not read, or a key it has: skipped
        member = _member(raw, where, contents, uploads)
        kept[member.key] = member
        total += member.size or 0
        if total > MAX_CALL_BYTES:
            raise BadFlowBytes(f"the members of this call pass the 32 MiB cap ({where})")
    document = _bytes_of(flow, uploads, "the flow file")
    digest = content_hash(document)
    contents[digest] = document
    bundle = FlowBundle(
        path=_text(flow, "path", "flow"),
        canonical=_text(flow, "canonical", "flow"),
        spelling=_spelling(flow.get("spelling", {"state": "listed"}), "flow.spelling"),
        document=digest,
        members=kept,
        update_baselines=update_baselines,
        linked=True,
    )
    return bundle, contents


def _encoded(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def call_body(
    bundle: FlowBundle, contents: dict[str, bytes], uploaded: Mapping[str, dict] | None = None
) -> dict:
    """The ``flow``, ``members`` and ``update_baselines`` fields a client sends for ``bundle``
    (``flow_from_call`` reads them back): every member's bytes inline, but those whose digest
    ``uploaded`` maps to the fields naming their upload (``upload_id``, ``content_hash``)."""
    uploaded = uploaded or {}

    def carried(digest: str, data: bytes) -> dict:
        named = uploaded.get(digest)
        if named is not None:
            return {**named, "size": len(data)}
        return {"content": _encoded(data), "size": len(data)}

    members = []
    for key in sorted(bundle.members):
        member = bundle.members[key]
        body = {
            name: value
            for name, value in member.to_json().items()
            if name not in ("sha256", "size")
        }
        data = None if member.sha256 is None else contents.get(member.sha256)
        if data is not None:
            body.update(carried(member.sha256, data))
        members.append(body)
    document = contents[bundle.document]
    flow = {
        "path": bundle.path,
        "canonical": bundle.canonical,
        "spelling": bundle.spelling,
        **carried(bundle.document, document),
    }
    return {"flow": flow, "members": members, "update_baselines": bundle.update_baselines}
