"""A flow as a call carries it (``flow_from_call``): the per-call cap on the members' bytes, the
members skipped or refused rather than refusing the call, the round trip of ``call_body``,
members and the flow file by upload, and the upload archive."""

from __future__ import annotations

import base64
import io
import tarfile

import pytest
from salvor.protocol import (
    MAX_CALL_BYTES,
    MAX_UPLOAD_BYTES,
    BadArchive,
    BadFlowBytes,
    FlowBundle,
    FlowMember,
    SentUpload,
    call_body,
    content_hash,
    flow_from_call,
    named_uploads,
    pack_upload,
    unpack_upload,
)

FLOW = {
    "path": "/p/.salvor/flows/f.yaml",
    "canonical": "/p/.salvor/flows/f.yaml",
    "content": base64.b64encode(b"schema_version: 1\n").decode(),
}


def _member(key: str, data: bytes | None = None, **fields) -> dict:
    member = {"role": "agent", "key": f"/p/agents\0{key}", "path": f"/p/agents/{key}"}
    member["canonical"] = member["path"]
    if data is not None:
        member.update(content=base64.b64encode(data).decode(), size=len(data))
    return {**member, **fields}


def test_the_members_of_one_call_share_one_cap() -> None:
    half = b"x" * (MAX_CALL_BYTES // 2)
    bundle, _ = flow_from_call(FLOW, [_member("a", half), _member("b", half)])
    assert len(bundle.members) == 2 and bundle.linked
    with pytest.raises(BadFlowBytes, match="members of this call pass the 32 MiB cap"):
        flow_from_call(FLOW, [_member("a", half), _member("b", half), _member("c", b"y")])


def test_unknown_roles_and_repeated_keys_are_skipped_and_a_bare_member_is_refused() -> None:
    members = [
        _member("a", b"first"),
        _member("a", b"second"),
        {**_member("t", b"shot"), "role": "screenshot"},
        _member("b"),
        _member("c", b"c", canonical="agents/c"),
    ]
    bundle, contents = flow_from_call(FLOW, members)
    kept = bundle.members
    assert sorted(kept) == ["/p/agents\0a", "/p/agents\0b", "/p/agents\0c"]
    assert contents[kept["/p/agents\0a"].sha256] == b"first"
    assert kept["/p/agents\0b"].state == "refused"
    assert "neither its bytes nor a state" in kept["/p/agents\0b"].error
    assert kept["/p/agents\0c"].state == "refused"


def test_call_body_is_read_back_as_the_same_bundle() -> None:
    data = b"model = 'm'\n"
    document = b"schema_version: 1\n"
    member = FlowMember(
        key="/p/agents\0a.toml",
        role="agent",
        path="/p/agents/a.toml",
        canonical="/p/agents/a.toml",
        sha256=content_hash(data),
        size=len(data),
    )
    missing = FlowMember(
        key="/p/agents\0b.toml",
        role="agent",
        path="/p/agents/b.toml",
        canonical="/p/agents/b.toml",
        state="missing",
    )
    bundle = FlowBundle(
        path=FLOW["path"],
        canonical=FLOW["canonical"],
        spelling={"state": "listed"},
        document=content_hash(document),
        members={member.key: member, missing.key: missing},
        update_baselines=True,
    )
    body = call_body(bundle, {member.sha256: data, bundle.document: document})
    read, contents = flow_from_call(
        body["flow"], body["members"], update_baselines=body["update_baselines"]
    )
    assert read.to_json() == {**bundle.to_json(), "linked": True}
    assert contents == {member.sha256: data, bundle.document: document}


def test_members_and_the_flow_file_by_upload_read_as_inline_ones() -> None:
    data, document = b"model = 'm'\n", b"schema_version: 1\n"
    uploads = {
        "upl_a": SentUpload("aa" * 32, data),
        "upl_f": SentUpload("ff" * 32, document),
    }
    flow = {**FLOW, "upload_id": "upl_f", "content_hash": "ff" * 32, "size": len(document)}
    del flow["content"]
    by_upload = {"upload_id": "upl_a", "content_hash": "aa" * 32, "size": len(data)}
    members = [_member("a", **by_upload), _member("b", b"inline")]
    assert named_uploads(flow, members + [_member("c", **by_upload)]) == ["upl_f", "upl_a"]
    bundle, contents = flow_from_call(flow, members, uploads=uploads)
    assert contents[bundle.members["/p/agents\0a"].sha256] == data
    assert contents[bundle.document] == document
    # The client's side writes the same fields back for the digests it uploaded.
    uploaded = {content_hash(data): {"upload_id": "upl_a", "content_hash": "aa" * 32}}
    body = call_body(bundle, contents, uploaded)
    (sent,) = [m for m in body["members"] if m["key"] == "/p/agents\0a"]
    assert "content" not in sent and sent["upload_id"] == "upl_a" and sent["size"] == len(data)
    assert flow_from_call(body["flow"], body["members"], uploads=uploads)[0] == bundle


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"upload_id": "upl_other"}, "does not hold"),
        ({"content_hash": "00" * 32}, "content_hash is not the hash"),
        ({"size": 3}, "declares 3 bytes"),
        ({"size": None}, "without its file's size"),
        ({"content": "eA=="}, "both content and an upload"),
    ],
)
def test_an_upload_named_wrongly_refuses_the_call(change: dict, reason: str) -> None:
    uploads = {"upl_a": SentUpload("aa" * 32, b"model = 'm'\n")}
    member = _member("a", upload_id="upl_a", content_hash="aa" * 32, size=12)
    member.update(change)
    with pytest.raises(BadFlowBytes, match=reason):
        flow_from_call(FLOW, [member], uploads=uploads)


def test_an_upload_is_one_regular_file_in_a_gzipped_tar() -> None:
    archive = pack_upload("agent.toml", b"model = 'm'\n")
    assert unpack_upload(archive) == b"model = 'm'\n"
    assert pack_upload("agent.toml", b"model = 'm'\n") == archive  # the same bytes, the same hash
    with pytest.raises(BadArchive, match="not a gzipped tar"):
        unpack_upload(b"model = 'm'\n")
    # A file past the cap is refused from its header, before its bytes are inflated.
    header = tarfile.TarInfo("big")
    header.size = MAX_UPLOAD_BYTES + 1
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.addfile(header, io.BytesIO(b"\0" * (MAX_UPLOAD_BYTES + 1)))
    with pytest.raises(BadArchive, match="over the 32 MiB cap"):
        unpack_upload(buffer.getvalue())
