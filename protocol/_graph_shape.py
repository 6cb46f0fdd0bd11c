"""A graph document's shape: the parsed value read into nodes and edges, field by field.

Rules:
* A document that is not the shape (a wrong type, a missing or unknown
  field, an unknown kind, ``schema_version`` other than 1, no nodes or more
  than ``MAX_NODES``) is
  ``malformed_document``: one error, naming the path of the first problem,
  and nothing else is checked.
* Within the shape, a field's value may still be wrong in a way that has its
  own code (an id that breaks the pattern, a blank or long name, a map's
  body, a gate's schema, a delay); those are collected, every one, and the
  graph-level checks still run (``_graph_checks.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ._clock import parse_instant
from ._errors import MalformedEvent, excerpt
from ._flow_bundle import is_flow_name
from ._graph import GRAPH_SCHEMA_VERSION, GraphEdge, GraphError, GraphNode, NodeKind
from ._schema import check_schema, schema_text
from ._shapes import HASH_PATTERN
from ._templates import Reducer, is_reference

NODE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
# The upstream check keeps a bitset of ancestors per node, n * n / 2 bits at worst (25 MB here); a
# body of 8 MB could otherwise hold 150,000 nodes and ask for 3 GB. A map fans out over data, so
# no real graph comes near this.
MAX_NODES = 20_000
# The distinct approval schemas of one graph's gates, their canonical texts together: each is
# compiled when the graph is checked (a few seconds of work at this size, off the event loop).
MAX_GRAPH_SCHEMA_BYTES = 256 * 1024
MAX_NAME_CHARS = 64
MAX_CONCURRENCY = 64
DEFAULT_CONCURRENCY = 8
MAX_DELAY_SECONDS = 365 * 24 * 3600
DEFAULT_APPROVAL_SCHEMA = {"type": "object"}

_AGENT_HASH = re.compile(HASH_PATTERN)
_TOP_FIELDS = frozenset({"schema_version", "nodes", "edges"})
_EDGE_FIELDS = frozenset({"from", "to", "case"})
_COMMON_FIELDS = frozenset({"id", "kind", "name"})
# Each kind's own fields, and which of them must be there (a map's missing body and a delay's
# missing instant have codes of their own, so they are not required here).
_KIND_FIELDS = {
    NodeKind.AGENT: frozenset({"agent", "agent_file", "input", "pinned"}),
    NodeKind.TOOL: frozenset({"tool", "input"}),
    NodeKind.GATE: frozenset({"prompt", "approval_schema"}),
    NodeKind.BRANCH: frozenset({"on", "cases", "default"}),
    NodeKind.MAP: frozenset({"over", "body", "concurrency"}),
    NodeKind.FOLD: frozenset({"over", "reducer", "field"}),
    NodeKind.DELAY: frozenset({"seconds", "until"}),
    NodeKind.FLOW: frozenset({"flow", "input", "update_baselines"}),
    NodeKind.SNAPSHOT: frozenset({"of"}),
}
_KIND_REQUIRED = {
    NodeKind.AGENT: (),
    NodeKind.TOOL: ("tool",),
    NodeKind.GATE: ("prompt",),
    NodeKind.BRANCH: ("on", "cases"),
    NodeKind.MAP: ("over",),
    NodeKind.FOLD: ("over", "reducer"),
    NodeKind.DELAY: (),
    NodeKind.FLOW: ("flow",),
    NodeKind.SNAPSHOT: ("name", "of"),
}
_BODY_KINDS = (NodeKind.AGENT, NodeKind.TOOL)
# Fields of a node that a map's body never takes (a map's items are child runs).
_NOT_IN_BODY = frozenset({"pinned"})
# The kinds whose omitted input defaults from the edges.
_INPUT_KINDS = (NodeKind.AGENT, NodeKind.TOOL, NodeKind.FLOW)
_KINDS = {str(kind): kind for kind in NodeKind}


class Malformed(Exception):
    """The document is not the shape; the message names where (becomes ``malformed_document``)."""


@dataclass
class Shape:
    """What reading the shape found: the nodes and edges, and the field errors collected."""

    nodes: list[GraphNode] = field(default_factory=list)
    edges: list[GraphEdge] = field(default_factory=list)
    errors: list[GraphError] = field(default_factory=list)
    # Ids of agent and tool nodes whose input was omitted (the default depends on the edges).
    default_input: set[str] = field(default_factory=set)
    # The line of each node's and each edge's mapping, for a document read from YAML.
    node_lines: list[int | None] = field(default_factory=list)
    edge_lines: list[int | None] = field(default_factory=list)
    # The approval schemas read so far (canonical texts) and their bytes together.
    schemas: set[bytes] = field(default_factory=set)
    schema_bytes: int = 0


def _kind_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def _require(ok: bool, where: str, what: str, value: Any) -> None:
    if not ok:
        raise Malformed(f"{where} must be {what}, not {_kind_name(value)}")


def _fields(value: Any, where: str, allowed: frozenset, required: tuple) -> dict:
    _require(isinstance(value, dict), where, "an object", value)
    if not value.keys() <= allowed:
        unknown = sorted(str(key) for key in value.keys() - allowed)
        raise Malformed(
            f"{where} has an unknown field {excerpt(unknown[0], 32)!r} "
            f"(allowed: {', '.join(sorted(allowed))})"
        )
    for name in required:
        if name not in value:
            raise Malformed(f"{where} lacks the field {name!r}")
    return value


def read_shape(document: Any, lines: Mapping[int, int] | None = None) -> Shape:
    """Read ``document`` into nodes and edges, collecting the errors of field values.

    ``lines`` maps ``id()`` of each object of a YAML document to its line; an
    error about a node or an edge then carries the line of its mapping.

    Raises:
        Malformed: the document is not the shape (the one ``malformed_document``).
    """
    _fields(document, "the document", _TOP_FIELDS, ("schema_version", "nodes", "edges"))
    version = document["schema_version"]
    if type(version) is not int or version != GRAPH_SCHEMA_VERSION:
        raise Malformed(f"schema_version must be {GRAPH_SCHEMA_VERSION}")
    nodes, edges = document["nodes"], document["edges"]
    _require(isinstance(nodes, list), "nodes", "a list", nodes)
    _require(isinstance(edges, list), "edges", "a list", edges)
    if not nodes:
        raise Malformed("nodes is empty: a graph has at least one node")
    if len(nodes) > MAX_NODES:
        raise Malformed(f"nodes holds {len(nodes)} nodes; a graph has at most {MAX_NODES}")
    shape = Shape()
    if lines is not None:
        shape.node_lines = [lines.get(id(value)) for value in nodes]
        shape.edge_lines = [lines.get(id(value)) for value in edges]
    for index, value in enumerate(nodes):
        found = len(shape.errors)
        shape.nodes.append(_read_node(value, f"nodes[{index}]", shape))
        if lines is not None and len(shape.errors) > found:
            line = shape.node_lines[index]
            shape.errors[found:] = [replace(error, line=line) for error in shape.errors[found:]]
    for index, value in enumerate(edges):
        shape.edges.append(_read_edge(value, f"edges[{index}]"))
    return shape


def node_line(shape: Shape, index: int) -> int | None:
    """The YAML line of node ``index`` (None for a document that did not come from YAML)."""
    return shape.node_lines[index] if shape.node_lines else None


def edge_line(shape: Shape, index: int) -> int | None:
    """The YAML line of edge ``index`` (None for a document that did not come from YAML)."""
    return shape.edge_lines[index] if shape.edge_lines else None


def _read_edge(value: Any, where: str) -> GraphEdge:
    _fields(value, where, _EDGE_FIELDS, ("from", "to"))
    for name in ("from", "to"):
        _require(isinstance(value[name], str), f"{where}.{name}", "a node id string", value[name])
    case = value.get("case")
    if "case" in value:
        _require(isinstance(case, str), f"{where}.case", "a string", case)
    return GraphEdge(value["from"], value["to"], case)


def _read_node(value: Any, where: str, shape: Shape) -> GraphNode:
    _require(isinstance(value, dict), where, "an object", value)
    node_id, kind_text = value.get("id"), value.get("kind")
    _require(isinstance(node_id, str), f"{where}.id", "a string", node_id)
    where = f"{where} ({excerpt(node_id, 32)!r})"
    kind = _KINDS.get(kind_text) if isinstance(kind_text, str) else None
    if kind is None:
        kinds = ", ".join(kind.value for kind in NodeKind)
        raise Malformed(f"{where}.kind must be one of {kinds}")
    required = ("id", "kind", *_KIND_REQUIRED[kind])
    if "pinned" in value and kind is not NodeKind.AGENT:
        raise Malformed(
            f"{where}.pinned: only an agent node is pinned (its calls to a recorded baseline); "
            f"a {kind.value} node takes no pinned"
        )
    _fields(value, where, _COMMON_FIELDS | _KIND_FIELDS[kind], required)
    if not NODE_ID.match(node_id):
        shape.errors.append(
            GraphError(
                code="invalid_node_id",
                message=f"{where}: a node id is a letter then up to 63 letters, digits, _ or -",
                node=node_id,
            )
        )
    name = value.get("name")
    if "name" in value:
        _require(isinstance(name, str), f"{where}.name", "a string", name)
        _check_name(name, node_id, where, shape.errors)
    fields = _KIND_READERS[kind](value, where, node_id, shape)
    # A gate has no input field: what it holds up for approval is what flows into it.
    if (kind in _INPUT_KINDS and "input" not in value) or kind is NodeKind.GATE:
        shape.default_input.add(node_id)
    return GraphNode(id=node_id, kind=kind, name=name, **fields)


def _check_name(name: str, node_id: str, where: str, errors: list[GraphError]) -> None:
    if len(name) > MAX_NAME_CHARS:
        errors.append(
            GraphError(
                code="node_name_too_long",
                message=f"{where}: the name has {len(name)} characters; at most "
                f"{MAX_NAME_CHARS} are allowed",
                node=node_id,
                extra={"length": len(name), "max": MAX_NAME_CHARS},
            )
        )
    elif not name.strip():
        errors.append(
            GraphError(
                code="blank_node_name",
                message=f"{where}: the name is blank; omit it or give it a word",
                node=node_id,
            )
        )


def _agent(value: dict, where: str, node_id: str, shape: Shape) -> dict:
    if ("agent" in value) == ("agent_file" in value):
        raise Malformed(f"{where} names its agent by exactly one of agent and agent_file")
    pinned = value.get("pinned", False)
    _require(isinstance(pinned, bool), f"{where}.pinned", "true or false", pinned)
    if "agent_file" in value:
        path = value["agent_file"]
        _require(isinstance(path, str), f"{where}.agent_file", "a file path string", path)
        if not path.strip() or "\0" in path:
            raise Malformed(f"{where}.agent_file must name a file")
        return {"agent_file": path, "input": value.get("input"), "pinned": pinned}
    agent = value["agent"]
    _require(isinstance(agent, str), f"{where}.agent", "an agent hash string", agent)
    if not _AGENT_HASH.match(agent):
        raise Malformed(f"{where}.agent must be an agent hash, sha256: and 64 lower-case hex")
    return {"agent": agent, "input": value.get("input"), "pinned": pinned}


def _snapshot(value: dict, where: str, node_id: str, shape: Shape) -> dict:
    name = value["name"]
    if not isinstance(name, str) or not is_flow_name(name):
        raise Malformed(
            f"{where}.name must name the snapshot's baseline file: letters, digits, ., _ or -, "
            "without .."
        )
    return {"of": _reference_field(value, "of", where)}


def _flow(value: dict, where: str, node_id: str, shape: Shape) -> dict:
    name = value["flow"]
    _require(isinstance(name, str), f"{where}.flow", "a flow name string", name)
    if not is_flow_name(name):
        raise Malformed(
            f"{where}.flow must be a flow's name: letters, digits, ., _ or -, without .. "
            "(the file <project>/.salvor/flows/<name>.yaml)"
        )
    update = value.get("update_baselines")
    if "update_baselines" in value:
        # Absent, the nested run updates its baselines when the run that starts it does.
        _require(isinstance(update, bool), f"{where}.update_baselines", "true or false", update)
    return {"flow": name, "input": value.get("input"), "update_baselines": update}


def _tool(value: dict, where: str, node_id: str, shape: Shape) -> dict:
    tool = value["tool"]
    _require(isinstance(tool, str), f"{where}.tool", "a tool name string", tool)
    if not tool.strip():
        raise Malformed(f"{where}.tool must name a tool, not be blank")
    return {"tool": tool, "input": value.get("input")}


def _gate(value: dict, where: str, node_id: str, shape: Shape) -> dict:
    prompt = value["prompt"]
    _require(isinstance(prompt, str), f"{where}.prompt", "a string", prompt)
    if not prompt.strip():
        raise Malformed(f"{where}.prompt must say what a person is asked, not be blank")
    schema = value.get("approval_schema", DEFAULT_APPROVAL_SCHEMA)
    try:
        text = schema_text(schema) if isinstance(schema, dict) else None
        if text is not None and text not in shape.schemas:
            shape.schemas.add(text)
            shape.schema_bytes += len(text)
            if shape.schema_bytes > MAX_GRAPH_SCHEMA_BYTES:
                raise Malformed(
                    f"{where}.approval_schema: the gates' approval schemas come to more than "
                    f"{MAX_GRAPH_SCHEMA_BYTES} bytes together; a graph may have at most that"
                )
        check_schema(schema)
    except MalformedEvent as exc:
        shape.errors.append(
            GraphError(
                code="invalid_approval_schema",
                message=f"{where}.approval_schema: {exc.message}",
                node=node_id,
            )
        )
    return {"prompt": prompt, "approval_schema": schema}


def _reference_field(value: dict, name: str, where: str) -> str:
    text = value[name]
    _require(isinstance(text, str), f"{where}.{name}", "a reference string", text)
    if not is_reference(text):
        raise Malformed(f"{where}.{name} must be a reference ($input..., $nodes...)")
    return text


def _branch(value: dict, where: str, node_id: str, shape: Shape) -> dict:
    on = _reference_field(value, "on", where)
    cases = value["cases"]
    _require(isinstance(cases, list), f"{where}.cases", "a list of strings", cases)
    if not cases or not all(isinstance(case, str) for case in cases):
        raise Malformed(f"{where}.cases must be a non-empty list of strings")
    if len(set(cases)) != len(cases):
        raise Malformed(f"{where}.cases names a case twice")
    default = value.get("default")
    if "default" in value:
        _require(isinstance(default, str), f"{where}.default", "a string", default)
        if default not in cases:
            shape.errors.append(
                GraphError(
                    code="unknown_case",
                    message=f"{where}: the default {excerpt(default, 32)!r} is not a case",
                    node=node_id,
                    extra={"case": default},
                )
            )
            default = None
    return {"on": on, "cases": tuple(cases), "default": default}


def _map(value: dict, where: str, node_id: str, shape: Shape) -> dict:
    over = _reference_field(value, "over", where)
    concurrency = value.get("concurrency", DEFAULT_CONCURRENCY)
    if type(concurrency) is not int or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise Malformed(f"{where}.concurrency must be an integer from 1 to {MAX_CONCURRENCY}")
    body = None
    if "body" not in value:
        shape.errors.append(
            GraphError(
                code="map_without_body",
                message=f"{where}: a map needs a body (an agent or tool node) to run per item",
                node=node_id,
            )
        )
    else:
        body = _map_body(value["body"], f"{where}.body", node_id, shape)
    return {"over": over, "concurrency": concurrency, "body": body}


def _map_body(value: Any, where: str, node_id: str, shape: Shape) -> GraphNode | None:
    problem = None
    if not isinstance(value, dict):
        problem = f"must be an object, not {_kind_name(value)}"
    elif value.get("kind") not in _BODY_KINDS:
        problem = "must be an agent or tool node (kind agent or tool)"
    elif "id" in value or "name" in value:
        problem = "takes no id or name: it runs under the map's"
    elif "pinned" in value:
        problem = "takes no pinned: a map's items are child runs, which no baseline answers"
    if problem is None:
        kind = NodeKind(value["kind"])
        try:
            allowed = (_KIND_FIELDS[kind] - _NOT_IN_BODY) | {"kind"}
            _fields(value, where, allowed, _KIND_REQUIRED[kind])
            fields = _KIND_READERS[kind](value, where, node_id, shape)
        except Malformed as exc:
            problem = str(exc).removeprefix(where).lstrip(" .:")
    if problem is not None:
        shape.errors.append(
            GraphError(code="invalid_map_body", message=f"{where} {problem}", node=node_id)
        )
        return None
    if "input" not in value:
        fields["input"] = "$item"
    return GraphNode(id=node_id, kind=kind, **fields)


def _fold(value: dict, where: str, node_id: str, shape: Shape) -> dict:
    over = _reference_field(value, "over", where)
    reducer = value["reducer"]
    if not isinstance(reducer, str) or reducer not in set(Reducer):
        reducers = ", ".join(reducer.value for reducer in Reducer)
        raise Malformed(f"{where}.reducer must be one of {reducers}")
    path = value.get("field")
    if "field" in value:
        _require(isinstance(path, str), f"{where}.field", "a dotted path string", path)
        if "" in path.split("."):
            raise Malformed(f"{where}.field must be a dotted path without empty segments")
    return {"over": over, "reducer": str(reducer), "field": path}


def _delay(value: dict, where: str, node_id: str, shape: Shape) -> dict:
    seconds, until = value.get("seconds"), value.get("until")
    problem = None
    if ("seconds" in value) == ("until" in value):
        problem = "a delay takes exactly one of seconds and until"
        seconds = until = None
    elif "seconds" in value:
        number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not number or not math.isfinite(seconds) or not 0 < seconds <= MAX_DELAY_SECONDS:
            problem = f"seconds must be a number above 0 and at most {MAX_DELAY_SECONDS} (a year)"
            seconds = None
    elif not isinstance(until, str):
        problem = "until must be an RFC 3339 instant or a reference to one"
        until = None
    elif not is_reference(until):
        try:
            parse_instant(until)
        except ValueError as exc:
            problem = f"until must be an RFC 3339 instant or a reference to one ({exc})"
    if problem is not None:
        shape.errors.append(
            GraphError(code="invalid_delay", message=f"{where}: {problem}", node=node_id)
        )
    return {"seconds": seconds, "until": until}


_KIND_READERS = {
    NodeKind.AGENT: _agent,
    NodeKind.TOOL: _tool,
    NodeKind.GATE: _gate,
    NodeKind.BRANCH: _branch,
    NodeKind.MAP: _map,
    NodeKind.FOLD: _fold,
    NodeKind.DELAY: _delay,
    NodeKind.FLOW: _flow,
    NodeKind.SNAPSHOT: _snapshot,
}
