"""A flow as a call carries it (``flow_from_call``): the per-call cap on the members' bytes, the
members skipped or refused rather than refusing the call, and the round trip of ``call_body``."""

from __future__ import annotations

import base64

import pytest
from salvor.protocol import (
    MAX_CALL_BYTES,
    BadFlowBytes,
    FlowBundle,
    FlowMember,
    call_body,
    content_hash,
    flow_from_call,
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
        {**_member("t", b"tool"), "role": "tool"},
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
