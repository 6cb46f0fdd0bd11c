"""A flow as a client sends it over a link: the flow file's bytes and its members, each with its
bytes inline (base64) or a state, turned into the bundle a daemon keeps with the run.

Rules (the daemon's side of the call):
* Every member is read before the document. Bytes that do not decode, that disagree with their
  declared ``size``, or that pass 32 MiB for one file or for all the members of the call refuse
  the whole call (``BadFlowBytes``, a 422), as does a member sent by upload (this daemon keeps no
  upload for it).
* A member of a role this daemon does not know, or with a key it already has, is skipped; one
  with neither bytes nor a state, or a flow member whose ``canonical`` or spelling is not valid,
  becomes refused, for the pre-check to report against the node that needs it.
* The bundle is marked linked: the pre-check then refuses what would run on the daemon's machine.
Pure: nothing here opens a path; the client's paths are only keys and words in messages.
"""

from __future__ import annotations

import base64
import binascii
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


def _decoded(value: Any, size: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise BadFlowBytes(f"{where}: content must be base64 text")
    if type(size) is int and size > MAX_MEMBER_BYTES:
        raise BadFlowBytes(f"{where} is {size} bytes, over the 32 MiB cap on one file")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadFlowBytes(f"{where}: content is not valid base64") from None
    if len(data) > MAX_MEMBER_BYTES:
        raise BadFlowBytes(f"{where} is {len(data)} bytes, over the 32 MiB cap on one file")
    if size is not None and size != len(data):
        raise BadFlowBytes(f"{where} declares {size!r} bytes and its content has {len(data)}")
    return data


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


def _member(raw: dict, where: str, contents: dict[str, bytes]) -> FlowMember:
    key, role = _text(raw, "key", where), raw["role"]
    if "upload" in raw or "upload_id" in raw:
        raise BadFlowBytes(f"{where} ({key!r}) names an upload this daemon does not have")
    canonical = raw.get("canonical")
    if not isinstance(canonical, str) or not canonical.startswith("/"):
        return _refused(raw, key, role, where, "its canonical path is not an absolute path")
    try:
        spelling = _spelling(raw.get("spelling", {"state": "listed"}), f"{where}.spelling")
    except MalformedBundle as exc:
        return _refused(raw, key, role, where, str(exc))
    path = _text(raw, "path", where)
    if "content" in raw:
        data = _decoded(raw["content"], raw.get("size"), f"{where} ({key!r})")
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


def flow_from_call(
    flow: Any, members: Any, *, update_baselines: bool = False
) -> tuple[FlowBundle, dict[str, bytes]]:
    """The linked bundle and the bytes by digest of a flow sent with a call.

    Raises:
        BadFlowBytes: a member's or the document's bytes fail a check, or a member names an
            upload (a 422; nothing was kept).
        MalformedBundle: the flow or a member is not the shape (a 400; nothing was kept).
    """
    if not isinstance(flow, dict):
        raise MalformedBundle("flow must be an object")
    if not isinstance(members, list):
        raise MalformedBundle("members must be a list")
    contents: dict[str, bytes] = {}
    kept: dict[str, FlowMember] = {}
    total = 0
    for index, raw in enumerate(members):
        where = f"members[{index}]"
        if not isinstance(raw, dict):
            raise MalformedBundle(f"{where} must be an object")
        if raw.get("role") not in MEMBER_ROLES or raw.get("key") in kept:
            continue  # a role this daemon does not read, or a key it has: skipped
        member = _member(raw, where, contents)
        kept[member.key] = member
        total += member.size or 0
        if total > MAX_CALL_BYTES:
            raise BadFlowBytes(f"the members of this call pass the 32 MiB cap ({where})")
    document = _decoded(flow.get("content"), flow.get("size"), "the flow file")
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


def call_body(bundle: FlowBundle, contents: dict[str, bytes]) -> dict:
    """The ``flow``, ``members`` and ``update_baselines`` fields a client sends for ``bundle``,
    every member's bytes inline (``flow_from_call`` reads them back)."""
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
            body.update(content=_encoded(data), size=len(data))
        members.append(body)
    document = contents[bundle.document]
    flow = {
        "path": bundle.path,
        "canonical": bundle.canonical,
        "spelling": bundle.spelling,
        "content": _encoded(document),
        "size": len(document),
    }
    return {"flow": flow, "members": members, "update_baselines": bundle.update_baselines}
