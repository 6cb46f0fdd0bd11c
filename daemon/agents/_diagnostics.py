"""Authoring diagnostics: every problem of an agent definition or a graph document, each at the
1-based line of the text it is about, with a severity, a sentence and (when one is near) a
suggestion — what ``flow_agents write`` and ``flow_write`` answer with.

An agent definition gets every refusal its fields give, each placed on the line of the key it
names: TOML's key or table line, JSON's key line, a markdown file's
front-matter line (its body for the system prompt), line 1 when the key is not written at all.
A graph document gets every validation error (a YAML document's carry their line; a JSON
document's are placed on the line of the node or edge they are about), an error for an agent node
naming an agent that is not registered, and warnings: an agent node whose agent declares inputs
the node's input does not wire, a reference to an output an agent does not declare.

Pure functions of the text (and the agents given); nothing is read from disk or stored.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from typing import Any

from salvor.protocol import (
    Diagnostic,
    GraphError,
    GraphNode,
    InvalidGraph,
    MalformedYaml,
    NodeKind,
    Severity,
    TemplateError,
    excerpt,
    graph_nodes,
    load_yaml_lines,
    parse_graph_json,
    parse_graph_yaml,
    parse_reference,
    reference_strings,
)

from ..skills import SkillLibrary
from ._credentials import Credentials
from ._definition import AgentDefinition, definition_refusals, parse_definition
from ._definition_error import DefinitionError
from ._markdown import markdown_line

Path = tuple[str | int, ...]

# Where a parser's own syntax error says it stopped.
_TOML_AT = re.compile(r"\(at line (\d+), column \d+\)")
_JSON_AT = re.compile(r": line (\d+) column \d+ \(char \d+\)")
_YAML_AT = re.compile(r"\bat line (\d+), column \d+")
# How many registered agents a suggestion for an unregistered one is looked for among.
_SUGGESTED_AGENTS = 500
# A graph entry named by its position, as a malformed document's message names it.
_ENTRY = re.compile(r"\b(?:nodes|edges)\[\d+\]")


def agent_diagnostics(
    text: str,
    fmt: str,
    *,
    known_tools=(),
    allow_processes: bool = False,
    credentials: Credentials | None = None,
    skills: SkillLibrary | None = None,
) -> list[Diagnostic]:
    """What is wrong with an agent definition's text (``"toml"``, ``"json"`` or ``"md"``), by line.

    Held to the rules a definition from outside the operator's disk meets (``parse_definition``
    with ``allow_paths=False``; processes only with ``allow_processes``). Every refusal its fields
    give checked one by one (``definition_refusals``: each unknown key and tool, each bad value),
    and the parser's own first refusal when it is none of those (its syntax, a process agent, the
    operator's declarations); ordered by line. The parser alone decides: a definition it accepts
    has no error. ``[]`` plus warnings for one that would register: a markdown agent without a
    ``description`` (the catalog a subagent caller picks from shows nothing of it).
    """
    rules = {
        "known_tools": known_tools,
        "allow_processes": allow_processes,
        "credentials": credentials,
        "skills": skills,
    }
    try:
        agent = parse_definition(text, fmt, allow_paths=False, **rules)
    except DefinitionError as exc:
        refusals = definition_refusals(text, fmt, **rules)
        if all(str(exc) != str(found) for found in refusals):
            refusals.insert(0, exc)
        refusals = _once_each(refusals)
        errors = [
            Diagnostic(
                line=_line_of(text, fmt, refusal),
                severity=Severity.ERROR,
                message=str(refusal),
                suggestion=refusal.suggestion,
            )
            for refusal in refusals
        ]
        return sorted(errors, key=lambda found: found.line)
    found = []
    if fmt == "md" and agent.description is None:
        found.append(
            Diagnostic(
                line=markdown_line(text, ("name",)),
                severity=Severity.WARNING,
                message="the agent has no `description`: the catalog shows nothing of what it "
                "does, so a subagent call has nothing to choose it by",
                suggestion="description: <one sentence on what it does and when to use it>",
            )
        )
    return found


def _once_each(refusals: list[DefinitionError]) -> list[DefinitionError]:
    """``refusals`` less a required key's absence when an unknown key is its misspelling (the
    unknown key's refusal names it, on the line where it is written)."""
    misspelt = {
        refusal.suggestion
        for refusal in refusals
        if refusal.suggestion and str(refusal).startswith("unknown ")
    }
    return [
        refusal
        for refusal in refusals
        if not (len(refusal.at) == 1 and refusal.at[0] in misspelt and "required" in str(refusal))
        and not (refusal.at == ("name",) and "name" in misspelt and "needs `name`" in str(refusal))
    ]


def _line_of(text: str, fmt: str, refusal: DefinitionError) -> int:
    message = str(refusal)
    # Only a refusal of the whole text (its syntax) is placed by its parser's words: a field's
    # refusal may quote the field's value, which could say anything.
    if not refusal.at:
        for pattern in (_TOML_AT, _JSON_AT, _YAML_AT):
            if (found := pattern.search(message)) is not None:
                return int(found[1])
        if "(at end of document)" in message:
            return max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
    if fmt == "md":
        return markdown_line(text, refusal.at)
    if fmt == "json":
        return _nearest(json_lines(text), refusal.at)
    return _nearest(toml_lines(text), refusal.at)


def _nearest(lines: Mapping[Path, int], at: Path) -> int:
    """The line of ``at``, else of the nearest enclosing field written, else 1."""
    for cut in range(len(at), 0, -1):
        if at[:cut] in lines:
            return lines[at[:cut]]
    return 1


# -- where a field is written ---------------------------------------------------------------------

_HEADER = re.compile(r"^\s*(\[\[?)\s*(.+?)\s*\]\]?\s*(?:#.*)?$")
_ASSIGNMENT = re.compile(r"^\s*([A-Za-z0-9_\-\"'. ]+?)\s*=")


def _key_parts(key: str) -> list[str]:
    return [part.strip().strip("\"'") for part in key.split(".")]


def toml_lines(text: str) -> dict[Path, int]:
    """The line of each table and key of a TOML text, by its path (an array of tables' entries
    by index: ``("tools", 0, "name")``); the first when a path repeats. Lines inside a
    multi-line string are skipped."""
    lines: dict[Path, int] = {}
    table: Path = ()
    entries: dict[Path, int] = {}  # an array of tables -> the index of its last entry
    in_string = False
    for number, line in enumerate(text.split("\n"), start=1):
        fences = line.count('"""') + line.count("'''")
        if in_string:
            in_string = fences % 2 == 0
            continue
        if fences % 2 == 1:
            in_string = True
        if (header := _HEADER.match(line)) is not None and "=" not in line.split("]")[0]:
            parts = _key_parts(header[2])
            path: list[str | int] = []
            for part in parts[:-1]:
                path.append(part)
                if tuple(path) in entries:
                    path.append(entries[tuple(path)])
            path.append(parts[-1])
            if header[1] == "[[":
                key = tuple(path)
                entries[key] = entries.get(key, -1) + 1
                path.append(entries[key])
            table = tuple(path)
            lines.setdefault(table, number)
            continue
        if (assignment := _ASSIGNMENT.match(line)) is not None:
            lines.setdefault((*table, *_key_parts(assignment[1])), number)
    return lines


def json_lines(text: str) -> dict[Path, int]:
    """The line of each value of a JSON text, by its path (keys, and array indexes); an object
    or array is at the line it opens on, a key's value at the key's line."""
    lines: dict[Path, int] = {}
    stack: list[list[Any]] = []  # [container kind, current key or index]
    line, index, end = 1, 0, len(text)
    pending_key: str | None = None

    def path() -> Path:
        return tuple(frame[1] for frame in stack if frame[1] is not None)

    while index < end:
        char = text[index]
        if char == "\n":
            line += 1
        elif char == '"':
            close = index + 1
            while close < end and text[close] != '"':
                close += 2 if text[close] == "\\" else 1
            raw = text[index : close + 1]
            rest = text[close + 1 :].lstrip(" \t\r\n")
            if stack and stack[-1][0] == "{" and rest.startswith(":"):
                try:
                    pending_key = json.loads(raw)
                except ValueError:
                    pending_key = raw.strip('"')
                stack[-1][1] = pending_key
                lines.setdefault(path(), line)
            line += raw.count("\n")
            index = close
        elif char in "{[":
            if stack and stack[-1][0] == "[":
                stack[-1][1] += 1
                lines.setdefault(path(), line)
            stack.append([char, -1 if char == "[" else None])
        elif char in "}]" and stack:
            stack.pop()
        index += 1
    return lines


# -- graphs ---------------------------------------------------------------------------------------


def graph_diagnostics(
    text: str,
    agents: Mapping[str, AgentDefinition] | None = None,
    registered: Mapping[str, str | None] | None = None,
) -> list[Diagnostic]:
    """What is wrong with a graph document (JSON when it opens with ``{``, else YAML), every
    problem at once, ordered by line.

    ``agents``: the registered agents by hash, at least those the document's agent nodes name
    (None: unknown, and the checks that need them are not made); ``registered``: every
    registered agent's hash and name, where a suggestion is looked for. Each validation error is
    an error. Then, for each agent node (or a map's agent body) whose shape reads, valid document
    or not: an error when its agent is not among ``agents`` (a graph naming it could never run
    here), with the nearest registered hash as the suggestion; a warning for each input its
    agent declares that the node's input (an object) does not name; and a warning for each
    reference ``$nodes.<id>.outputs.<name>`` to an agent node whose agent declares no output
    ``<name>`` (its finish never carries one).
    """
    is_json = text.lstrip().startswith("{")
    node_lines = _graph_lines(text, is_json)
    try:
        graph = parse_graph_json(text) if is_json else parse_graph_yaml(text)
    except InvalidGraph as refused:
        found = [_graph_error(error, node_lines) for error in refused.errors]
        nodes = graph_nodes(text)
    else:
        found, nodes = [], graph.nodes
    if agents is not None:
        found += _agent_node_problems(nodes, node_lines, agents, registered or {})
        found += _output_references(nodes, node_lines, agents)
    return sorted(found, key=lambda diagnostic: diagnostic.line)


def _call(node: GraphNode) -> GraphNode:
    """What an agent node runs: itself, or a map's body."""
    return node.body if node.body is not None else node


def _agent_node_problems(
    nodes: tuple[GraphNode, ...],
    node_lines: Mapping[str, int],
    agents: Mapping[str, AgentDefinition],
    registered: Mapping[str, str | None],
) -> list[Diagnostic]:
    found: list[Diagnostic] = []
    for index, node in enumerate(nodes):
        target = _call(node)
        if target.agent is None:
            continue
        line = node_lines.get(f"nodes[{index}]") or node_lines.get(node.id, 1)
        agent = agents.get(target.agent)
        if agent is None:
            found.append(
                Diagnostic(
                    line=line,
                    severity=Severity.ERROR,
                    message=f"agent node {node.id!r} names the agent {target.agent}, which is not "
                    "registered here (flow_agents list gives the registered agents' hashes)",
                    suggestion=_registered_near(target.agent, node, registered),
                )
            )
            continue
        # A template passing a whole value on (not an object) wires nothing by name.
        if not isinstance(target.input, dict):
            continue
        wired = set(target.input)
        label = agent.name or agent.agent_def_hash
        for declared in agent.inputs:
            if declared.name not in wired:
                found.append(
                    Diagnostic(
                        line=line,
                        severity=Severity.WARNING,
                        message=f"agent node {node.id!r} does not wire the declared input "
                        f"{declared.name!r} of agent {label!r}",
                        suggestion=f'input: {{"{declared.name}": "$input.{declared.name}"}}',
                    )
                )
    return found


def _registered_near(
    agent: str, node: GraphNode, registered: Mapping[str, str | None]
) -> str | None:
    """The registered hash nearest ``agent`` (a hash mistyped), else the hash of the agent whose
    name is nearest the node's name or id (the newest registration of a name), else None."""
    # The newest registrations only: the cost of a guess stays bounded however many there are.
    hashes = list(registered)[-_SUGGESTED_AGENTS:]
    near = difflib.get_close_matches(agent, hashes, n=1, cutoff=0.9)
    if near:
        return near[0]
    by_name = {registered[held]: held for held in hashes if registered[held]}
    word = node.name or node.id
    near = difflib.get_close_matches(word, list(by_name), n=1) if len(word) <= 128 else []
    return by_name[near[0]] if near else None


def _output_references(
    nodes: tuple[GraphNode, ...],
    node_lines: Mapping[str, int],
    agents: Mapping[str, AgentDefinition],
) -> list[Diagnostic]:
    """A warning for each ``$nodes.<id>.outputs.<name>`` naming an output the agent of node
    ``<id>`` does not declare."""
    declared: dict[str, tuple[str, ...]] = {}
    for node in nodes:
        agent = agents.get(node.agent) if node.agent is not None else None
        if node.kind is NodeKind.AGENT and agent is not None:
            declared.setdefault(node.id, tuple(output.name for output in agent.outputs))
    found: list[Diagnostic] = []
    for index, node in enumerate(nodes):
        line = node_lines.get(f"nodes[{index}]") or node_lines.get(node.id, 1)
        for text in _references(node):
            try:
                reference = parse_reference(text)
            except TemplateError:
                continue  # a validation error already
            outputs = declared.get(reference.node or "")
            if outputs is None or len(reference.path) < 2 or reference.path[0] != "outputs":
                continue
            if reference.path[1] in outputs:
                continue
            # difflib's cost grows with the square of the lengths: no guess for a long word.
            close = (
                difflib.get_close_matches(reference.path[1], outputs, n=1)
                if len(reference.path[1]) <= 128
                else []
            )
            near = close[0] if close else None
            shown = ", ".join(outputs) or "none"
            found.append(
                Diagnostic(
                    line=line,
                    severity=Severity.WARNING,
                    message=f"node {node.id!r} reads {excerpt(text, 80)}, but the agent of node "
                    f"{reference.node!r} declares no output {reference.path[1]!r} (it declares: "
                    f"{shown}), so the reference finds nothing when the flow runs",
                    suggestion=f"$nodes.{reference.node}.outputs.{near}" if near else None,
                )
            )
    return found


def _references(node: GraphNode) -> list[str]:
    """Every reference string of ``node``'s templates (a map's body's too)."""
    templates = [node.input, node.on, node.over, node.until, node.of]
    if node.body is not None:
        templates.append(node.body.input)
    texts: list[str] = []
    for template in templates:
        if template is not None:
            texts += reference_strings(template)
    return texts


def graph_error_diagnostics(text: str, errors: list[GraphError]) -> list[Diagnostic]:
    """``errors`` found in the graph document ``text`` (a valid one), each at its node's line
    (line 1 for an error with no node of ``text``)."""
    node_lines = _graph_lines(text, text.lstrip().startswith("{"))
    return [_graph_error(error, node_lines) for error in errors]


def _graph_error(error: GraphError, node_lines: Mapping[str, int]) -> Diagnostic:
    line = error.line
    syntax = error.code == "malformed_document"
    if (
        line is None
        and syntax
        and (found := _YAML_AT.search(error.message) or _JSON_AT.search(error.message))
    ):
        line = int(found[1])
    if line is None and error.node is not None:
        line = node_lines.get(error.node)
    if line is None and error.edge is not None:
        line = node_lines.get(f"{error.edge[0]}->{error.edge[1]}")
    if line is None and (found := _ENTRY.search(error.message)) is not None:
        line = node_lines.get(found[0])  # a malformed entry, named by its position
    return Diagnostic(
        line=line or 1,
        severity=Severity.ERROR,
        message=error.message,
        suggestion=error.suggestion,
    )


def _graph_lines(text: str, is_json: bool) -> dict[str, int]:
    """The line of each node by id and by position (``nodes[2]``), and of each edge as
    ``"from->to"`` and by position: a JSON document's from its text, a YAML one's from its
    mappings; ``{}`` for a text neither reads."""
    try:
        if is_json:
            document = json.loads(text)
            lines = json_lines(text)
            node_line = {index: lines.get(("nodes", index)) for index in range(_count(document))}
            edge_line = {
                index: lines.get(("edges", index)) for index in range(_count(document, "edges"))
            }
        else:
            document, mapping_lines = load_yaml_lines(text, "the graph document")
            node_line = {
                index: mapping_lines.get(id(node))
                for index, node in enumerate(_entries(document, "nodes"))
            }
            edge_line = {
                index: mapping_lines.get(id(edge))
                for index, edge in enumerate(_entries(document, "edges"))
            }
    except (ValueError, MalformedYaml, RecursionError):  # its one error is its syntax's
        return {}
    found: dict[str, int] = {}
    for index, node in enumerate(_entries(document, "nodes")):
        if node_line.get(index):
            found[f"nodes[{index}]"] = node_line[index]
            if isinstance(node, dict) and isinstance(node.get("id"), str):
                found.setdefault(node["id"], node_line[index])
    for index, edge in enumerate(_entries(document, "edges")):
        if edge_line.get(index):
            found[f"edges[{index}]"] = edge_line[index]
            if isinstance(edge, dict):
                found.setdefault(f"{edge.get('from')}->{edge.get('to')}", edge_line[index])
    return found


def _entries(document: Any, key: str) -> list:
    value = document.get(key) if isinstance(document, dict) else None
    return value if isinstance(value, list) else []


def _count(document: Any, key: str = "nodes") -> int:
    return len(_entries(document, key))
