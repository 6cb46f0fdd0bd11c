"""The body that starts a graph run: a stored graph by hash, a flow kept by name, or a flow file
sent over a link with the members it reaches.
"""

from __future__ import annotations

from ..web import bad_request
from ._body import Body, Field, boolean_check, labels_check, list_check, object_check, string_check
from ._schema import ANY, ref


def _graph_or_flow(body: dict) -> None:
    if sum(field in body for field in ("graph_hash", "flow", "flow_name")) != 1:
        raise bad_request("the body names exactly one of `graph_hash`, `flow_name` and `flow`")
    if "flow" not in body and ("members" in body or "update_baselines" in body):
        raise bad_request("`members` and `update_baselines` go with a `flow`")


_SPELLING = {
    "type": "object",
    "required": ["state"],
    "properties": {
        "state": {"enum": ["listed", "case_folded", "absent"]},
        "actual": {"type": "string"},
        "addressable": {"type": "boolean"},
    },
    "description": "How the client's directory lists the file's name.",
}
_BASE64 = {"type": "string", "contentEncoding": "base64"}
# A file's bytes by upload (``POST /v1/uploads``) instead of inline: the id, the archive's hash.
_UPLOADED = {
    "upload_id": {
        "type": "string",
        "description": "An upload holding the file's bytes, instead of `content`; spent by this "
        "call whether it starts a run or is refused.",
    },
    "content_hash": {
        "type": "string",
        "description": "The SHA-256 (hex) of that upload's archive, as its upload answered.",
    },
}
_FLOW_FILE = {
    "type": "object",
    "required": ["path", "canonical"],
    "oneOf": [{"required": ["content"]}, {"required": ["upload_id", "content_hash", "size"]}],
    "properties": {
        "path": {"type": "string", "description": "The flow file's path on the client."},
        "canonical": {
            "type": "string",
            "description": "Its real path on the client; what it names resolves beside it.",
        },
        "spelling": _SPELLING,
        "content": {**_BASE64, "description": "The flow file's bytes."},
        **_UPLOADED,
        "size": {"type": "integer", "minimum": 0},
    },
}
_FLOW_MEMBER = {
    "type": "object",
    "required": ["role", "key", "path"],
    "properties": {
        "role": {
            "type": "string",
            "description": "flow, agent, prompt or baseline; a member of another role is skipped.",
        },
        "key": {
            "type": "string",
            "description": "The real directory of the file naming it, a NUL, and the target as "
            "written (a baseline's: its path). A later member with the same key is skipped.",
        },
        "path": {"type": "string"},
        "canonical": {"type": "string", "description": "Its real path on the client."},
        "spelling": _SPELLING,
        "content": {**_BASE64, "description": "Its bytes, when the client sent them."},
        **_UPLOADED,
        "size": {"type": "integer", "minimum": 0, "description": "Its file's bytes."},
        "state": {"enum": ["missing", "refused", "listed"]},
        "error": {"type": "string", "description": "Why the client refused it."},
    },
}
START_GRAPH_RUN = Body(
    "StartGraphRun",
    (
        Field(
            name="graph_hash",
            schema=ref("GraphHash"),
            check=string_check("`graph_hash` must be a graph hash string"),
            description="A stored graph to run (or send a `flow_name` or a `flow` instead).",
        ),
        Field(
            name="flow_name",
            schema=ref("FlowName"),
            check=string_check("`flow_name` must be a flow's `namespace/name`"),
            description="A flow kept by name: the run walks the graph of its current version "
            "as the call finds it (a later version never changes a run started), and is "
            "labelled `salvor.flow` with the name.",
        ),
        Field(
            name="flow",
            schema=_FLOW_FILE,
            check=object_check("`flow` must be an object"),
            description=(
                "A flow file sent over a link, run with its `members` (the files it reaches) "
                "and never opened on this machine: every member is checked before the document, "
                "then the whole flow is pre-checked before its first node."
            ),
        ),
        Field(
            name="members",
            schema={"type": "array", "items": _FLOW_MEMBER},
            check=list_check("`members` must be a list"),
        ),
        Field(
            name="update_baselines",
            schema={"type": "boolean"},
            check=boolean_check("`update_baselines` must be a boolean"),
            description="Snapshots capture their values, and pinned agent nodes their calls, as "
            "new baselines instead of comparing.",
        ),
        Field(name="input", schema=ANY, description="The run's input; null when left out."),
        Field(name="labels", schema=ref("Labels"), nullable=True, check=labels_check),
    ),
    precheck=_graph_or_flow,
    rules={
        "oneOf": [{"required": ["graph_hash"]}, {"required": ["flow_name"]}, {"required": ["flow"]}]
    },
)
