"""The entry points that read a graph document: from a parsed value, JSON text or YAML text.

Rules:
* Text goes through the strict readers (``parse_strict``, ``load_yaml``),
  a value through ``check_document``, then the shape (``_graph_shape.py``),
  then every check (``_graph_checks.py``); a refusal at any stage is one
  ``InvalidGraph`` listing every error found, and nothing is built.
* What a ``Graph`` keeps is the document as submitted and its hash; the
  defaults (a node's input) live only in its nodes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ._canonical import sha256_hash
from ._graph import Graph, GraphError, GraphNode, InvalidGraph
from ._graph_checks import run_checks
from ._graph_shape import Malformed, Shape, read_shape
from ._strict_json import MalformedJson, check_document, decode_text, parse_strict
from ._yaml import MalformedYaml, load_yaml_lines


def _malformed(message: str) -> GraphError:
    return GraphError(code="malformed_document", message=message)


def _validate(
    value: Any, *, strict_json: bool = False, lines: dict[int, int] | None = None
) -> tuple[list[GraphError], Shape | None, str | None]:
    """Every error of ``value``, its shape (None when malformed) and its hash (when it has one).

    ``strict_json`` says ``parse_strict`` read the value, so its rules already hold (a walk of
    the whole document saved); ``lines`` are a YAML document's lines (``load_yaml_lines``).
    """
    try:
        if not strict_json:
            check_document(value, "the graph document")
        digest = sha256_hash(value)
    except MalformedJson as exc:
        return [_malformed(exc.message)], None, None
    except (TypeError, ValueError) as exc:
        return [_malformed(f"the graph document is not a JSON value: {exc}")], None, None
    try:
        shape = read_shape(value, lines)
    except Malformed as exc:
        return [_malformed(f"the graph document is malformed: {exc}")], None, None
    return run_checks(shape), shape, digest


def check_graph(value: Any) -> list[GraphError]:
    """Every validation error of a parsed graph document; ``[]`` when it is valid. Never raises."""
    return _validate(value)[0]


def graph_nodes(text: str) -> tuple[GraphNode, ...]:
    """The nodes a graph document's text reads into (JSON when it opens with ``{``, else YAML),
    whether or not the graph validates, as written (no default inputs); ``()`` when the text
    or its shape does not read. For the authoring checks of a document with errors. Never
    raises."""
    try:
        if text.lstrip().startswith("{"):
            value = parse_strict(text, "the graph document")
        else:
            value, _ = load_yaml_lines(text, "the graph document")
        return tuple(read_shape(value).nodes)
    except (MalformedJson, MalformedYaml, Malformed, ValueError, TypeError, RecursionError):
        return ()


def _with_default_inputs(shape: Shape) -> list[GraphNode]:
    sources: dict[str, list[str]] = {}
    for edge in shape.edges:
        targets = sources.setdefault(edge.target, [])
        if edge.source not in targets:
            targets.append(edge.source)
    nodes = []
    for node in shape.nodes:
        if node.id in shape.default_input:
            found = sources.get(node.id, [])
            if not found:
                template: Any = "$input"
            elif len(found) == 1:
                template = f"$nodes.{found[0]}"
            else:
                template = {source: f"$nodes.{source}" for source in found}
            node = replace(node, input=template)
        nodes.append(node)
    return nodes


def graph_from_value(value: Any) -> Graph:
    """The validated graph of a parsed document (a JSON value).

    Raises:
        InvalidGraph: listing every error; nothing is built.
    """
    return _graph_of(value, strict_json=False)


def _graph_of(value: Any, *, strict_json: bool, lines: dict[int, int] | None = None) -> Graph:
    errors, shape, digest = _validate(value, strict_json=strict_json, lines=lines)
    if errors:
        raise InvalidGraph(errors)
    assert shape is not None and digest is not None
    return Graph(
        document=value,
        hash=digest,
        nodes=tuple(_with_default_inputs(shape)),
        edges=tuple(shape.edges),
    )


def parse_graph_json(text: str | bytes) -> Graph:
    """The validated graph of a JSON text (strict JSON: ``parse_strict``'s rules).

    Raises:
        InvalidGraph: the text is not strict JSON (one ``malformed_document``)
            or the document fails validation (every error).
    """
    try:
        value = parse_strict(text, "the graph document")
    except MalformedJson as exc:
        raise InvalidGraph([_malformed(exc.message)]) from None
    return _graph_of(value, strict_json=True)


def parse_graph_yaml(text: str | bytes) -> Graph:
    """The validated graph of a YAML text (``_yaml.py``'s strict rules).

    Raises:
        InvalidGraph: the text is not strict YAML (one ``malformed_document``
            naming line and column) or the document fails validation (every
            error, each about a node or an edge with the ``line`` of it).
    """
    try:
        if isinstance(text, (bytes, bytearray)):
            text = decode_text(bytes(text), "the graph document")
        value, lines = load_yaml_lines(text, "the graph document")
    except (MalformedJson, MalformedYaml) as exc:
        raise InvalidGraph([_malformed(exc.message)]) from None
    return _graph_of(value, strict_json=False, lines=lines)
