"""Validation of a graph document whose shape read: every error at once.

Rules:
* Once the shape reads (``_graph_shape.py``), every check runs and every
  error is reported; no check stops the others. Checks that need a sound
  structure work on what is sound: an edge with a missing end, a self edge or
  a duplicate is reported and left out of the structure the later checks see.
* Cost stays near linear in the document: the cycle search visits only the
  nodes a topological pass could not order, and "is this node upstream" is
  one pass over that order with an integer bitset per node, built only when
  a reference names a node.
* A suggestion is the nearest existing node id (``_suggestions.py``), or null.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from ._errors import excerpt
from ._graph import GraphEdge, GraphError, GraphNode, NodeKind
from ._graph import topological_order as _order
from ._graph_shape import Shape, edge_line, node_line
from ._suggestions import Suggester, nearest
from ._templates import MAP_ROOTS, ReferenceRoot, TemplateError, parse_reference
from ._templates import reference_strings as _reference_strings


@dataclass
class _Structure:
    """The sound part of a document: unique nodes and the edges both of whose ends exist."""

    by_id: dict[str, GraphNode]
    suggest: Suggester
    edges: list[GraphEdge] = field(default_factory=list)
    errors: list[GraphError] = field(default_factory=list)


def _unique_nodes(nodes: list[GraphNode], errors: list[GraphError]) -> dict[str, GraphNode]:
    by_id: dict[str, GraphNode] = {}
    for index, node in enumerate(nodes):
        if node.id in by_id:
            errors.append(
                GraphError(
                    code="duplicate_node_id",
                    message=f"nodes[{index}]: the id {excerpt(node.id, 32)!r} is used by an "
                    "earlier node",
                    node=node.id,
                    extra={"index": index},
                )
            )
        else:
            by_id[node.id] = node
    return by_id


def _edge_error(code: str, message: str, edge: GraphEdge, **extra: Any) -> GraphError:
    suggestion = extra.pop("suggestion", None)
    return GraphError(
        code=code,
        message=message,
        edge=(edge.source, edge.target),
        suggestion=suggestion,
        extra=extra,
    )


def _sound_edges(shape: Shape, found: _Structure) -> None:
    seen: set[tuple[str, str, str | None]] = set()
    for index, edge in enumerate(shape.edges):
        reported = len(found.errors)
        _check_edge(index, edge, seen, found)
        line = edge_line(shape, index)
        if line is not None and len(found.errors) > reported:
            found.errors[reported:] = [replace(e, line=line) for e in found.errors[reported:]]


def _check_edge(index: int, edge: GraphEdge, seen: set, found: _Structure) -> None:
    """Report what is wrong with one edge; keep it in the structure when both ends exist and it
    is neither a self edge nor a repeat."""
    where = f"edges[{index}] ({excerpt(edge.source, 32)} -> {excerpt(edge.target, 32)})"
    missing = [end for end in (edge.source, edge.target) if end not in found.by_id]
    for end in dict.fromkeys(missing):
        found.errors.append(
            _edge_error(
                "dangling_edge",
                f"{where}: there is no node {excerpt(end, 32)!r}",
                edge,
                missing=end,
                suggestion=found.suggest(end, found.by_id),
            )
        )
    if missing:
        return
    if edge.source == edge.target:
        message = f"{where}: a node cannot feed itself"
        found.errors.append(_edge_error("self_edge", message, edge))
        return
    key = (edge.source, edge.target, edge.case)
    if key in seen:
        found.errors.append(
            _edge_error("duplicate_edge", f"{where}: the same edge appears earlier", edge)
        )
        return
    seen.add(key)
    found.edges.append(edge)
    _check_case(edge, where, found)


def _check_case(edge: GraphEdge, where: str, found: _Structure) -> None:
    source = found.by_id[edge.source]
    if source.kind is not NodeKind.BRANCH:
        if edge.case is not None:
            found.errors.append(
                _edge_error(
                    "case_on_non_branch",
                    f"{where}: only an edge out of a branch carries a case "
                    f"({excerpt(edge.source, 32)!r} is a {source.kind})",
                    edge,
                    case=edge.case,
                )
            )
    elif edge.case is None:
        found.errors.append(
            _edge_error(
                "branch_edge_without_case",
                f"{where}: an edge out of a branch names the case it is taken on",
                edge,
                suggestion=source.cases[0] if len(source.cases) == 1 else None,
            )
        )
    elif edge.case not in source.cases:
        found.errors.append(
            _edge_error(
                "unknown_case",
                f"{where}: {excerpt(edge.case, 32)!r} is not one of the branch's cases "
                f"({', '.join(source.cases)})",
                edge,
                case=edge.case,
                suggestion=found.suggest(edge.case, source.cases, f"cases of {source.id}"),
            )
        )


def _missing_case_edges(found: _Structure) -> None:
    taken: dict[str, set[str | None]] = {}
    for edge in found.edges:
        taken.setdefault(edge.source, set()).add(edge.case)
    for node in found.by_id.values():
        if node.kind is not NodeKind.BRANCH:
            continue
        for case in node.cases:
            if case not in taken.get(node.id, ()):
                found.errors.append(
                    GraphError(
                        code="missing_case_edge",
                        message=f"branch {excerpt(node.id, 32)!r}: no edge is taken on the "
                        f"case {excerpt(case, 32)!r}",
                        node=node.id,
                        extra={"case": case},
                    )
                )


def _components(members: list[str], targets: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of ``members`` with more than one node (Tarjan's,
    by an explicit stack)."""
    inside = set(members)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in members:
        if root in index:
            continue
        work = [(root, iter(targets[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            step = next((t for t in pending if t in inside), None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(targets[step])))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component[::-1])
    return found


def _cycle_through(start: str, members: set[str], targets: dict[str, list[str]]) -> list[str]:
    """The shortest cycle from ``start`` back to itself inside ``members`` (breadth first)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in targets[node]:
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1]
            if target in members and target not in parent:
                parent[target] = node
                queue.append(target)
    return [start]  # unreachable for a member of a strongly connected component


def _structure_errors(found: _Structure) -> list[str]:
    """Cycles and unreachable nodes; returns the topological order of the nodes it could order."""
    ids = list(found.by_id)
    order = _order(ids, found.edges)
    if len(order) == len(ids):
        return list(order)
    targets: dict[str, list[str]] = {node_id: [] for node_id in ids}
    has_inbound: set[str] = set()
    for edge in found.edges:
        targets[edge.source].append(edge.target)
        has_inbound.add(edge.target)
    ordered = set(order)
    on_cycle: set[str] = set()
    position = {node_id: i for i, node_id in enumerate(ids)}
    components = [
        sorted(component, key=position.__getitem__)
        for component in _components([i for i in ids if i not in ordered], targets)
    ]
    # Each cycle starts at its first node in document order, and cycles come in that order.
    for component in sorted(components, key=lambda members: position[members[0]]):
        members = set(component)
        on_cycle |= members
        cycle = _cycle_through(component[0], members, targets)
        shown = " -> ".join(excerpt(node_id, 32) for node_id in [*cycle, cycle[0]])
        found.errors.append(
            GraphError(
                code="cycle",
                message=f"the edges {shown} form a cycle; a graph is acyclic",
                node=cycle[0],
                extra={"nodes": cycle},
            )
        )
    # A node every inbound edge of which leaves a cycle can never run. Nodes further down are not
    # reported: they follow from it, and fixing the cycle fixes them.
    fed_from_outside = {edge.target for edge in found.edges if edge.source not in on_cycle}
    for node_id in ids:
        if node_id in has_inbound and node_id not in on_cycle | fed_from_outside:
            found.errors.append(
                GraphError(
                    code="unreachable_node",
                    message=f"node {excerpt(node_id, 32)!r} is fed only by nodes on a cycle, so "
                    "no walk from an entry node reaches it",
                    node=node_id,
                )
            )
    return list(order)


def _templates(node: GraphNode) -> list[tuple[Any, bool]]:
    """The templates of ``node`` as (template, inside a map body)."""
    if node.kind in (NodeKind.AGENT, NodeKind.TOOL, NodeKind.FLOW):
        return [(node.input, False)]
    if node.kind is NodeKind.MAP:
        return [(node.over, False)] + ([(node.body.input, True)] if node.body else [])
    values = (node.on, node.over, node.until, node.of)
    return [(value, False) for value in values if value is not None]


def _ancestors(order: list[str], edges: list[GraphEdge], position: dict[str, int]) -> dict:
    """Each ordered node's ancestors as an integer with bit ``position[id]`` set for each."""
    sources: dict[str, list[str]] = {}
    for edge in edges:
        sources.setdefault(edge.target, []).append(edge.source)
    ancestors: dict[str, int] = {}
    for node_id in order:
        bits = 0
        for source in sources.get(node_id, ()):
            bits |= ancestors[source] | (1 << position[source])
        ancestors[node_id] = bits
    return ancestors


def _malformed_reference(node_id: str, text: str, exc: TemplateError) -> GraphError:
    root, dot, rest = text[1:].partition(".")
    root_near = nearest(root, [str(root) for root in ReferenceRoot])
    suggestion = None if root_near in (None, root) else f"${root_near}{dot}{rest}"
    return GraphError(
        code="unknown_reference",
        message=f"node {excerpt(node_id, 32)!r}: {exc.message}",
        node=node_id,
        suggestion=suggestion,
        extra={"reference": text},
    )


def _reference_error(
    node: GraphNode, text: str, in_body: bool, found: _Structure, ancestors: _Ancestors
) -> GraphError | None:
    """What is wrong with the reference ``text`` of ``node``, or None."""
    try:
        reference = parse_reference(text)
    except TemplateError as exc:
        return _malformed_reference(node.id, text, exc)
    where = f"node {excerpt(node.id, 32)!r}: {excerpt(text, 48)}"
    extra = {"reference": text}
    if reference.root in MAP_ROOTS and not in_body:
        message = f"{where} means something only inside a map's body"
        return GraphError(code="misplaced_reference", message=message, node=node.id, extra=extra)
    if reference.root is not ReferenceRoot.NODES:
        return None
    if reference.node not in found.by_id:
        return GraphError(
            code="unknown_reference",
            message=f"{where} names no node of this graph",
            node=node.id,
            suggestion=found.suggest(reference.node, found.by_id),
            extra=extra,
        )
    if ancestors.upstream(reference.node, of=node.id) is False:
        return GraphError(
            code="reference_not_upstream",
            message=f"{where} names a node no path leads from, so its output is not there "
            "when this node runs",
            node=node.id,
            extra=extra,
        )
    return None


class _Ancestors:
    """Whether one node is upstream of another, from bitsets built on the first question."""

    def __init__(self, order: list[str], found: _Structure) -> None:
        self._order, self._found = order, found
        self._position = {node_id: index for index, node_id in enumerate(found.by_id)}
        self._bits: dict[str, int] | None = None

    def upstream(self, node_id: str, *, of: str) -> bool | None:
        """True when ``node_id`` is an ancestor of ``of``; None when ``of`` sits on or behind a
        cycle (it has no ancestors to speak of, and the cycle is reported already)."""
        if self._bits is None:
            self._bits = _ancestors(self._order, self._found.edges, self._position)
        bits = self._bits.get(of)
        return None if bits is None else bool(bits >> self._position[node_id] & 1)


def _reference_errors(found: _Structure, order: list[str]) -> None:
    ancestors = _Ancestors(order, found)
    for node in found.by_id.values():
        for template, in_body in _templates(node):
            for text in _reference_strings(template):
                error = _reference_error(node, text, in_body, found, ancestors)
                if error is not None:
                    found.errors.append(error)


def run_checks(shape: Shape) -> list[GraphError]:
    """Every error of a document whose shape read: the field errors ``shape`` collected, then
    those of its ids, edges, cases, structure and references, in that order."""
    errors = list(shape.errors)
    found = _Structure(_unique_nodes(shape.nodes, errors), Suggester(), errors=errors)
    _sound_edges(shape, found)
    _missing_case_edges(found)
    order = _structure_errors(found)
    _reference_errors(found, order)
    if shape.node_lines:
        _place_on_lines(shape, found)
    return found.errors


def _place_on_lines(shape: Shape, found: _Structure) -> None:
    """Give each error about a node the YAML line of that node (a repeated id: of the repeat)."""
    first: dict[str, int] = {}
    for index, node in enumerate(shape.nodes):
        first.setdefault(node.id, index)
    for position, error in enumerate(found.errors):
        if error.line is not None or error.node is None:
            continue
        index = error.extra["index"] if error.code == "duplicate_node_id" else first[error.node]
        found.errors[position] = replace(error, line=node_line(shape, index))
