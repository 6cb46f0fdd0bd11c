"""The graph endpoints' shapes: the graph document as JSON Schema, a validation error, and the
fixed-shape answers of ``/v1/graphs*``.

The document's schema says to a client what the validator (``salvor.protocol.check_graph``)
admits field by field; what only the whole document can say (a cycle, a dangling edge, a
reference to a node that is not upstream) is the validator's alone, so a document this schema
admits may still be refused as ``invalid_graph``, never the other way round. Plain data, built at
import.
"""

from __future__ import annotations

from salvor.protocol import FLOW_NAME

from ._agent_schemas import NOT_BLANK
from ._answers import Answer
from ._body import Field
from ._schema import ANY, HASH_PATTERN, JSON, closed, ref

# The limits are the validator's (``protocol/_graph_shape.py``); tests/daemon/api/test_graphs.py
# holds this schema's kinds and fields to the validator's own tables.
_NODE_ID = {
    "type": "string",
    "pattern": "^[A-Za-z][A-Za-z0-9_-]{0,63}$",
    "description": "Unique within the document.",
}
_NAME = {
    "type": "string",
    "maxLength": 64,
    "pattern": NOT_BLANK,
    "description": "A display label; it hashes like every other field.",
}
_REFERENCE = {
    "type": "string",
    "pattern": "^\\$(?!\\$)",
    "description": "A reference: `$input`, `$input.<path>`, `$nodes.<id>`, `$nodes.<id>.<path>` "
    "(and `$item`, `$index` inside a map body).",
}
_TEMPLATE = {
    **ANY,
    "description": "Any JSON value; a string starting with `$` is a reference replaced by the "
    "value it names (`$$` escapes a literal `$`). Default: `$input` for a node with no inbound "
    "edge, `$nodes.<p>` for one predecessor, an object of them for several.",
}
_KIND_FIELDS: dict[str, tuple[JSON, tuple[str, ...]]] = {
    "agent": (
        {
            "agent": ref("AgentHash"),
            "agent_file": {
                "type": "string",
                "description": "Instead of `agent`, in a flow file: the agent file, beside the "
                "flow's real file (a run of the flow file brings it along).",
            },
            "input": _TEMPLATE,
        },
        (),
    ),
    "tool": (
        {"tool": {"type": "string", "pattern": NOT_BLANK}, "input": _TEMPLATE},
        ("tool",),
    ),
    "gate": (
        {
            "prompt": {"type": "string", "pattern": NOT_BLANK},
            "approval_schema": {
                "type": "object",
                "description": "The JSON Schema a resume's approval must match; default "
                '`{"type": "object"}`.',
            },
        },
        ("prompt",),
    ),
    "branch": (
        {
            "on": _REFERENCE,
            "cases": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "uniqueItems": True,
            },
            "default": {"type": "string", "description": "One of `cases`."},
        },
        ("on", "cases"),
    ),
    "map": (
        {
            "over": _REFERENCE,
            "body": ref("GraphMapBody"),
            "concurrency": {"type": "integer", "minimum": 1, "maximum": 64, "default": 8},
        },
        ("over", "body"),
    ),
    "fold": (
        {
            "over": _REFERENCE,
            "reducer": {"enum": ["sum", "count", "concat", "merge", "collect"]},
            "field": {
                "type": "string",
                "pattern": "^[^.]+(\\.[^.]+)*$",
                "description": "A dotted path read from each item first.",
            },
        },
        ("over", "reducer"),
    ),
    "flow": (
        {
            "flow": {
                "type": "string",
                "pattern": FLOW_NAME.pattern,
                "description": "In a flow file: the flow `<project>/.salvor/flows/<flow>.yaml` "
                "of its project, run as a child graph run.",
            },
            "input": _TEMPLATE,
            "update_baselines": {
                "type": "boolean",
                "description": "Whether the nested run updates its baselines instead of "
                "comparing them; absent, it does as the run that starts it does.",
            },
        },
        ("flow",),
    ),
    "snapshot": (
        {
            "of": {
                **_REFERENCE,
                "description": "In a flow file: the value held against the baseline "
                "`__baselines__/<flow>/<name>.json` beside the flow's real file.",
            }
        },
        ("name", "of"),
    ),
    "delay": (
        {
            "seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 365 * 24 * 3600},
            "until": {
                "type": "string",
                "description": "An RFC 3339 instant, or a reference to one.",
            },
        },
        (),
    ),
}
# What a map runs per item: an agent or tool node without id and name.
_BODY_KINDS = ("agent", "tool")


def _node(kind: str) -> JSON:
    fields, required = _KIND_FIELDS[kind]
    schema = closed(
        {"id": _NODE_ID, "kind": {"const": kind}, "name": _NAME, **fields},
        ("id", "kind", *required),
    )
    if kind == "delay":
        # Exactly one of the two.
        schema["oneOf"] = [{"required": ["seconds"]}, {"required": ["until"]}]
    if kind == "agent":
        schema["oneOf"] = [{"required": ["agent"]}, {"required": ["agent_file"]}]
        schema["properties"]["pinned"] = {
            "type": "boolean",
            "default": False,
            "description": "In a flow file: the node's calls are held against its baseline "
            "`__baselines__/<flow>/<id>.calls.json` and answered from it, none sent or performed "
            "(a run updating its baselines records them instead). Not on a map's body.",
        }
    return schema


GRAPH_SCHEMAS: JSON = {
    "GraphHash": {
        "type": "string",
        "pattern": HASH_PATTERN,
        "description": "sha256 over the RFC 8785 canonical JSON of the document as submitted "
        "(JSON and YAML of one document hash alike).",
    },
    "GraphDocument": {
        "description": "A graph: nodes and the edges between them, acyclic. Unknown fields are "
        "refused (`malformed_document`).",
        **closed(
            {
                "schema_version": {"const": 1},
                "nodes": {"type": "array", "minItems": 1, "items": ref("GraphNode")},
                "edges": {"type": "array", "items": ref("GraphEdge")},
            },
            ("schema_version", "nodes", "edges"),
        ),
    },
    "GraphNode": {
        "description": "One node, by `kind`.",
        "oneOf": [_node(kind) for kind in _KIND_FIELDS],
    },
    "GraphMapBody": {
        "description": "The node a map runs once per item: an agent or tool node without `id` "
        "and `name`; its input defaults to `$item`.",
        "oneOf": [
            closed(
                {"kind": {"const": kind}, **_KIND_FIELDS[kind][0]},
                ("kind", *_KIND_FIELDS[kind][1]),
            )
            for kind in _BODY_KINDS
        ],
    },
    "GraphEdge": closed(
        {
            "from": _NODE_ID,
            "to": _NODE_ID,
            "case": {
                "type": "string",
                "description": "Only on an edge out of a branch: the case that takes it.",
            },
        },
        ("from", "to"),
    ),
    "FlowName": {
        "type": "string",
        "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}/[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        "description": "A flow kept by name: `namespace/name`.",
    },
    "GraphError": {
        "description": "One validation error. `node` or `edge` says where; a code may carry "
        "fields of its own (`missing` for a dangling edge, `nodes` for a cycle, ...).",
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "A stable machine token."},
            "message": {"type": "string"},
            "node": {"type": "string"},
            "edge": closed({"from": {"type": "string"}, "to": {"type": "string"}}, ("from", "to")),
            "suggestion": {
                "type": ["string", "null"],
                "description": "The likely fix (a misspelt id's nearest one), or null.",
            },
        },
        "required": ["code", "message", "suggestion"],
    },
    "GraphShape": closed(
        {
            "node_count": {"type": "integer", "minimum": 1},
            "edge_count": {"type": "integer", "minimum": 0},
            "entry_nodes": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Nodes with no inbound edge, in document order.",
            },
            "terminal_nodes": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Nodes with no outbound edge, in document order.",
            },
        },
        ("node_count", "edge_count", "entry_nodes", "terminal_nodes"),
    ),
}


def _required(name: str, schema: JSON, description: str = "") -> Field:
    return Field(name=name, schema=schema, required=True, description=description)


_GRAPH = _required("graph", ref("GraphHash"))
_SHAPE = GRAPH_SCHEMAS["GraphShape"]["properties"]

GRAPH_CREATED = Answer(
    "GraphCreated",
    (
        _GRAPH,
        _required(
            "created",
            {"type": "boolean"},
            description="False when the identical document was already stored.",
        ),
        Field(
            name="flow",
            schema=ref("FlowName"),
            description="With `?name=`: the name the graph is kept as.",
        ),
        Field(
            name="version",
            schema={"type": "integer", "minimum": 1},
            description="With `?name=`: the version the name now stands at.",
        ),
        Field(
            name="new_version",
            schema={"type": "boolean"},
            description="With `?name=`: false when the name's current version already had "
            "this graph (no new version).",
        ),
    ),
)
GRAPH_SUMMARY = Answer(
    "GraphSummary",
    (_GRAPH, *(_required(name, schema) for name, schema in _SHAPE.items())),
    description="A stored graph in a listing: its hash and shape.",
)
GRAPH_LIST = Answer(
    "GraphList", (_required("graphs", {"type": "array", "items": ref("GraphSummary")}),)
)
GRAPH = Answer(
    "Graph",
    (
        _GRAPH,
        _required("document", ref("GraphDocument"), description="The document as submitted."),
    ),
)
GRAPH_VALID = Answer(
    "GraphValid",
    (_required("valid", {"const": True}), _GRAPH, _required("summary", ref("GraphShape"))),
)
GRAPH_INVALID = Answer(
    "GraphInvalid",
    (
        _required("valid", {"const": False}),
        _required(
            "errors",
            {"type": "array", "minItems": 1, "items": ref("GraphError")},
            description="Every error found, as `POST /v1/graphs` refuses with them.",
        ),
    ),
)

_FLOW_FIELDS = (
    _required("flow", ref("FlowName")),
    _required("namespace", {"type": "string"}),
    _required("name", {"type": "string"}),
    _required("graph", ref("GraphHash"), description="The current version's graph."),
    _required(
        "version",
        {"type": "integer", "minimum": 1},
        description="The current version: versions are numbered from 1 and never removed, so "
        "it is also how many the flow has had.",
    ),
    _required("updated_at", {"type": "string"}, description="When the current version was kept."),
)
FLOW_SUMMARY = Answer(
    "FlowSummary", _FLOW_FIELDS, description="A named flow at its current version."
)
FLOW_LIST = Answer(
    "FlowList",
    (
        _required(
            "flows",
            {"type": "array", "items": ref("FlowSummary")},
            description="By namespace, then name.",
        ),
    ),
)
FLOW_VERSION = Answer(
    "FlowVersion",
    (
        _required("version", {"type": "integer", "minimum": 1}),
        _required("graph", ref("GraphHash")),
        _required("created_at", {"type": "string"}),
        Field(
            name="run",
            schema={"type": "string"},
            description="The run whose `flow_write` kept it; absent for a caller of the API.",
        ),
    ),
)
FLOW = Answer(
    "Flow",
    (
        *_FLOW_FIELDS,
        _required(
            "versions",
            {"type": "array", "items": ref("FlowVersion"), "minItems": 1},
            description="Every version, oldest first; a run started on one walks its graph.",
        ),
    ),
)

GRAPH_ANSWERS = (
    GRAPH_CREATED,
    GRAPH_SUMMARY,
    GRAPH_LIST,
    GRAPH,
    GRAPH_VALID,
    GRAPH_INVALID,
    FLOW_SUMMARY,
    FLOW_LIST,
    FLOW_VERSION,
    FLOW,
)
