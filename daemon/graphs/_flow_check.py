"""The pre-check of a flow run: the whole flow and every member it reaches, before the first node.

A flow run is given its files as a bundle (``FlowFiles``: the manifest and the bytes by digest);
nothing here opens a path. Every agent node naming an ``agent_file`` finds that file by its key
(the real directory of the flow file, a NUL, the target as written), its ``system_prompt_path``
likewise beside the agent file, and every ``flow`` node the nested flow of the project by its key,
whose own nodes are checked the same way, down to ``MAX_FLOW_DEPTH`` levels. A tool node's file
arguments (the tools' declared file inputs) are held to the rules of ``_tool_files``.

Every problem is a ``GraphError`` (the ``invalid_graph`` list): a code per reason, the node named,
and the file that holds it (``extra.file``). Nothing is stored or started for a flow that has one.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from salvor.protocol import (
    MAX_FLOW_DEPTH,
    TOOL_FILE_SUFFIXES,
    FileInputs,
    FlowBundle,
    FlowMember,
    Graph,
    GraphError,
    GraphNode,
    InvalidGraph,
    NodeKind,
    declared_arguments,
    is_file_argument,
    member_key,
    nested_flow_key,
    parse_graph_json,
    parse_graph_yaml,
)

from ..agents import AgentDefinition, AgentKind, DefinitionError, parse_definition
from ..skills import SkillLibrary
from ._pinned_baseline import baseline_calls, calls_baseline_path

# Parses an agent file's text in its format, its prompt file read through the callable given.
AgentParser = Callable[[str, str, Callable[[str], str]], AgentDefinition]

_AGENT_FORMATS = {".json": "json", ".md": "md", ".markdown": "md"}


@dataclass(frozen=True, slots=True)
class FlowFiles:
    """A flow bundle and the bytes of its document and members, by digest; on the client,
    ``updating``: the baseline directories of the call's runs that update their baselines (the
    only ones it writes baselines into)."""

    bundle: FlowBundle
    contents: Mapping[str, bytes]
    updating: frozenset[str] = frozenset()

    def document_bytes(self) -> bytes | None:
        return self.contents.get(self.bundle.document)

    def member_bytes(self, member: FlowMember) -> bytes | None:
        return None if member.sha256 is None else self.contents.get(member.sha256)

    def nested(self, member: FlowMember, node: GraphNode) -> FlowFiles:
        """The files of the nested flow ``member`` is, run by the flow node ``node``: the same
        members, its own document, its baselines under the node's id, updated when the node
        says so (or, when it does not say, when this run updates its own)."""
        update = node.update_baselines
        bundle = replace(
            self.bundle,
            path=member.path,
            canonical=member.canonical,
            spelling=member.spelling,
            document=member.sha256 or "",
            stem=node.id,
            update_baselines=self.bundle.update_baselines if update is None else update,
        )
        return FlowFiles(bundle, self.contents)


@dataclass
class CheckedFlow:
    """What the pre-check found: the flow's graph with each agent file bound to its agent's hash
    (None when the document itself failed), the agents of its agent files by hash, every graph
    it reaches (its own and its nested flows', bound), and every error."""

    graph: Graph | None = None
    agents: dict[str, AgentDefinition] = field(default_factory=dict)
    graphs: list[Graph] = field(default_factory=list)
    errors: list[GraphError] = field(default_factory=list)
    # Each agent's file by its hash: the path the flow's files name it by.
    agent_files: dict[str, str] = field(default_factory=dict)


def registry_parser(known_tools, skills: SkillLibrary | None = None) -> AgentParser:
    """How a flow's agent files are read on this daemon: against ``known_tools`` and its
    ``skills``, their prompt files from the flow's files (never from this machine's disk)."""

    def parse(text: str, fmt: str, read_prompt: Callable[[str], str]) -> AgentDefinition:
        return parse_definition(
            text, fmt, known_tools=known_tools, read_prompt=read_prompt, skills=skills
        )

    return parse


def nested_member(files: FlowFiles, node: GraphNode) -> FlowMember | None:
    """The member a ``flow`` node of the flow of ``files`` runs, or None (the pre-check refused
    a flow that lacks it)."""
    project = files.bundle.project
    if project is None or node.flow is None:
        return None
    return files.bundle.members.get(nested_flow_key(project, node.flow))


def parse_flow_document(data: bytes, name: str) -> Graph:
    """The validated graph of a flow file's bytes (JSON for a ``.json`` name, else YAML).

    Raises:
        InvalidGraph: every error of the document.
    """
    if name.lower().endswith(".json"):
        return parse_graph_json(data)
    return parse_graph_yaml(data)


def bind_agents(graph: Graph, hashes: Mapping[str, str]) -> Graph:
    """``graph`` with each agent-file node (a map's body too) naming its agent by hash.

    The document and its hash stay the flow file's: only the walk's nodes change.
    """
    nodes = []
    for node in graph.nodes:
        if node.id in hashes:
            if node.kind is NodeKind.MAP and node.body is not None:
                node = replace(node, body=replace(node.body, agent=hashes[node.id]))
            else:
                node = replace(node, agent=hashes[node.id])
        nodes.append(node)
    return Graph(document=graph.document, hash=graph.hash, nodes=tuple(nodes), edges=graph.edges)


def not_a_file_argument(tool: str, argument: str, value: Any) -> str:
    """Why ``value`` given to the file input ``argument`` of ``tool`` cannot come from a client."""
    shown = value if isinstance(value, str) else "the node's input as a whole"
    return (
        f"argument {argument} of {tool} is a file the client sends, and {shown!r} is not one: "
        f"write an absolute path ending in one of {', '.join(TOOL_FILE_SUFFIXES)} in the node's "
        "input (a $ reference, a relative path or another kind of file would be read on the "
        "daemon's machine)"
    )


class _Check:
    """One pre-check: its parser, whether the run came over a link, the file inputs of the
    tools (tool name -> arguments), and what it found."""

    def __init__(self, parse_agent: AgentParser, linked: bool, file_inputs: FileInputs) -> None:
        self.parse_agent = parse_agent
        self.linked = linked
        self.file_inputs = file_inputs
        self.agents: dict[str, AgentDefinition] = {}
        self.agent_files: dict[str, str] = {}
        self.graphs: list[Graph] = []
        self.errors: list[GraphError] = []

    def error(self, code: str, node: GraphNode | None, message: str, file: str, **extra) -> None:
        self.errors.append(
            GraphError(
                code=code,
                message=message,
                node=None if node is None else node.id,
                extra={"file": file, **extra},
            )
        )

    def member(
        self, files: FlowFiles, key: str, node: GraphNode, what: str, file: str
    ) -> tuple[FlowMember, bytes] | None:
        """The member ``key`` and its bytes, or None with the error reported."""
        member = files.bundle.members.get(key)
        target = key.partition("\0")[2]
        where = f"node {node.id!r} in {file}"
        if member is None:
            self.error(
                "unknown_member",
                node,
                f"{where}: the {what} {target!r} was not sent with the flow (no file has the "
                f"key {key.replace(chr(0), '/')!r}); the client collects every file a flow names",
                file,
                target=target,
            )
            return None
        # Before missing: on a case-sensitive disk the misspelt name is missing as well.
        if member.spelling.get("state") == "case_folded":
            actual = member.spelling.get("actual")
            self.error(
                "member_spelling",
                node,
                f"{where}: the {what} {target!r} is listed as {actual!r} on the client; "
                "write the name as its directory lists it",
                file,
                target=target,
                actual=actual,
            )
            return None
        if member.state == "missing":
            self.error(
                "missing_member",
                node,
                f"{where}: could not load the {what} {target!r}: no such file, "
                f"{member.canonical!r}",
                file,
                target=target,
            )
            return None
        if member.state is not None:
            reason = member.error or f"the client only listed {member.canonical!r}"
            self.error("refused_member", node, f"{where}: {reason}", file, target=target)
            return None
        data = files.member_bytes(member)
        if data is None:
            self.error(
                "unknown_member",
                node,
                f"{where}: the bytes of the {what} {target!r} were not sent with the flow",
                file,
                target=target,
            )
            return None
        return member, data

    def flow(self, files: FlowFiles, depth: int, chain: tuple[str, ...]) -> Graph | None:
        """Check the flow of ``files`` (``chain``: the flow files above it) and its members."""
        bundle = files.bundle
        data = files.document_bytes()
        if data is None:
            return None  # the caller reported the member
        try:
            graph = parse_flow_document(data, bundle.canonical)
        except InvalidGraph as exc:
            for error in exc.errors:
                self.errors.append(replace(error, extra={**error.extra, "file": bundle.canonical}))
            return None
        hashes: dict[str, str] = {}
        for node in graph.nodes:
            call = node.body if node.kind is NodeKind.MAP else node
            if call is None:
                continue
            if call.kind is NodeKind.AGENT and call.agent_file is not None:
                agent = self.agent_file(files, node, call.agent_file, depth + 1)
                if agent is not None:
                    hashes[node.id] = agent.agent_def_hash
            elif call.kind is NodeKind.FLOW:
                self.nested(files, node, depth + 1, chain)
            elif call.kind is NodeKind.TOOL:
                self.tool_files(files, node, call)
            if node.pinned and not bundle.update_baselines:
                self.pinned_baseline(files, node)
        bound = bind_agents(graph, hashes)
        self.graphs.append(bound)
        return bound

    def agent_file(
        self, files: FlowFiles, node: GraphNode, target: str, depth: int
    ) -> AgentDefinition | None:
        file = files.bundle.canonical
        if depth > MAX_FLOW_DEPTH:
            self.too_deep(node, file)
            return None
        key = member_key(posixpath.dirname(file), target)
        found = self.member(files, key, node, "agent file", file)
        if found is None:
            return None
        member, data = found
        prompt_dir = posixpath.dirname(member.canonical)

        def read_prompt(prompt: str) -> str:
            prompt_key = member_key(prompt_dir, prompt)
            got = self.member(files, prompt_key, node, "prompt file", member.canonical)
            if got is None:
                raise DefinitionError(f"its system_prompt_path {prompt!r} was not sent usable")
            try:
                return got[1].decode("utf-8")
            except UnicodeDecodeError:
                raise DefinitionError(f"system_prompt_path {prompt!r} is not UTF-8") from None

        reported = len(self.errors)
        try:
            text = data.decode("utf-8")
            fmt = _AGENT_FORMATS.get(posixpath.splitext(member.canonical)[1].lower(), "toml")
            agent = self.parse_agent(text, fmt, read_prompt)
        except (UnicodeDecodeError, DefinitionError) as exc:
            if len(self.errors) == reported:  # the prompt's own error says it already
                self.error(
                    "invalid_agent_file",
                    node,
                    f"node {node.id!r}: the agent file {member.canonical} does not load: {exc}",
                    file,
                    target=target,
                )
            return None
        if self.linked and agent.kind is not AgentKind.BUILTIN:
            self.error(
                "process_agent_over_link",
                node,
                f"node {node.id!r}: the agent file {member.canonical} is a {agent.kind.value} "
                "agent, whose command would run on the daemon's machine; a flow sent over a link "
                "runs built-in agents only",
                file,
                target=target,
            )
            return None
        self.agents[agent.agent_def_hash] = agent
        self.agent_files.setdefault(agent.agent_def_hash, member.canonical)
        return agent

    def pinned_baseline(self, files: FlowFiles, node: GraphNode) -> None:
        """A comparing run's pinned node: a baseline sent that is not a list of calls is
        refused before the first node (a missing one fails the run at the node, as a snapshot's
        does, saying to capture it)."""
        path = calls_baseline_path(files.bundle, node.id)
        member = files.bundle.members.get(path)
        data = None if member is None or member.state is not None else files.member_bytes(member)
        if data is None:
            return
        try:
            _, problem = baseline_calls(json.loads(data))
        except ValueError:
            problem = "it is not JSON"
        if problem is not None:
            self.error(
                "invalid_baseline",
                node,
                f"node {node.id!r}: the baseline {path} is not its calls: {problem}",
                files.bundle.canonical,
                baseline=path,
            )

    def nested(self, files: FlowFiles, node: GraphNode, depth: int, chain: tuple) -> None:
        file = files.bundle.canonical
        project = files.bundle.project
        if project is None:
            self.error(
                "flow_without_project",
                node,
                f"node {node.id!r}: {file} is not under a project's .salvor/flows, so it cannot "
                f"name the flow {node.flow!r} by name",
                file,
            )
            return
        if depth > MAX_FLOW_DEPTH:
            self.too_deep(node, file)
            return
        found = self.member(files, nested_flow_key(project, node.flow), node, "flow", file)
        if found is None:
            return
        member = found[0]
        if member.canonical in chain or member.canonical == file:
            shown = " -> ".join([*chain, file, member.canonical])
            self.error(
                "flow_cycle",
                node,
                f"node {node.id!r}: the flow {node.flow!r} names a flow above it ({shown}); "
                "flows nest without a cycle",
                file,
                chain=[*chain, file, member.canonical],
            )
            return
        self.flow(files.nested(member, node), depth, (*chain, file))

    def tool_files(self, files: FlowFiles, node: GraphNode, call: GraphNode) -> None:
        """The file arguments of a tool node (or a map's tool body): over a link, a file input
        given anything but a file argument is refused; a file the client refused, everywhere.
        (A file the client has not is the step's failure, when the walk reaches it.)"""
        file = files.bundle.canonical
        for argument, value in declared_arguments(call, self.file_inputs):
            if not is_file_argument(value):
                if self.linked:
                    message = not_a_file_argument(call.tool, argument, value)
                    self.error(
                        "tool_file_argument",
                        node,
                        f"node {node.id!r} in {file}: {message}",
                        file,
                        tool=call.tool,
                        argument=argument,
                    )
                continue
            member = files.bundle.members.get(value)
            if member is not None and member.state == "refused":
                self.error(
                    "refused_member",
                    node,
                    f"node {node.id!r} in {file}: argument {argument} of {call.tool}: "
                    f"{member.error}",
                    file,
                    target=value,
                )

    def too_deep(self, node: GraphNode, file: str) -> None:
        self.error(
            "flow_too_deep",
            node,
            f"node {node.id!r} in {file}: agent files and nested flows reach more than "
            f"{MAX_FLOW_DEPTH} levels deep",
            file,
            max=MAX_FLOW_DEPTH,
        )


def check_flow(
    files: FlowFiles, parse_agent: AgentParser, file_inputs: FileInputs | None = None
) -> CheckedFlow:
    """The pre-check of a flow run of ``files``: every error, or the graph bound to its agents.

    ``file_inputs``: the tools' declared file inputs (tool name -> arguments); a tool file the
    client refused is an error, and over a link a file input given anything but a file argument.

    Never raises for what the files hold; a linked bundle (``bundle.linked``) also refuses
    agents other than built-in ones.
    """
    check = _Check(parse_agent, files.bundle.linked, file_inputs or {})
    bundle = files.bundle
    if bundle.spelling.get("state") == "case_folded":
        check.error(
            "member_spelling",
            None,
            f"the flow file {bundle.path} is listed as {bundle.spelling.get('actual')!r} on the "
            "client; name it as its directory lists it",
            bundle.canonical,
            actual=bundle.spelling.get("actual"),
        )
    if files.document_bytes() is None:
        check.error(
            "unknown_member",
            None,
            f"the bytes of the flow file {bundle.path} were not sent",
            bundle.canonical,
        )
    graph = check.flow(files, 0, ())
    return CheckedFlow(
        graph=graph if not check.errors else None,
        agents=check.agents,
        graphs=check.graphs,
        errors=check.errors,
        agent_files=check.agent_files,
    )
