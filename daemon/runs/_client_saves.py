"""Authoring over a link: ``flow_agents`` write and ``flow_write`` in a run tree that came with
``X-Salvor-Linked`` save their file on the client, never on this daemon.

The file is checked as a local write checks it, and refused for what a linked run would refuse
(an agent that runs a command on this machine; a flow the link's pre-check would stop, every
problem listed), before anything is recorded as written. A good one is answered with
``saved_to``, a directive for the client (``{"path", "content", "encoding": "base64"}``) under
the client's project: ``<P>/.salvor/agents/<name>.md`` (``.toml`` for a TOML agent) and
``<P>/.salvor/flows/<name>.yaml`` (a project's flows are one directory, named by file, which is
how a ``flow`` node names them: the namespace stays in the answer's ``flow`` only). Nothing is
registered or stored: the call's recorded answer keeps the directive, which is where the stream's
result and this run's later checks read it back from.
"""

from __future__ import annotations

import posixpath

from salvor.protocol import (
    Diagnostic,
    FlowBundle,
    FlowMember,
    GraphError,
    GraphNode,
    InvalidGraph,
    NodeKind,
    Severity,
    content_hash,
    is_flow_name,
    member_key,
    member_path,
    nested_flow_key,
)

from ..agents import (
    AgentDefinition,
    AgentKind,
    Credentials,
    DefinitionError,
    agent_diagnostics,
    graph_diagnostics,
    graph_error_diagnostics,
    parse_definition,
)
from ..flows import FlowSession
from ..graphs import (
    AgentParser,
    FlowFiles,
    check_flow,
    client_file,
    parse_flow_document,
    saved_files,
)
from ..tools import ToolFailed, ToolRegistry
from ..web import OperationRefused, off_loop
from ._authoring import FLOW_NAME, answer, graph_agents, has_errors, parsed_graph
from ._definitions import Definitions

NO_PROJECT = (
    "this run came over a link from a flow file that is not under a project's .salvor/flows "
    "(or whose project path is too long to name), so there is no project on the client to save "
    "{what} into; run the flow from <project>/.salvor/flows/ to author files"
)
PROCESS_OVER_LINK = (
    "the agent file is a {kind} agent, whose command would run on the daemon's machine; a run "
    "sent over a link writes built-in agents only (process_agent_over_link)"
)


def _error(message: str, line: int = 1) -> Diagnostic:
    return Diagnostic(line, Severity.ERROR, message)


def _agent_format(content: str) -> str:
    """Markdown when the text opens with front matter, else TOML."""
    return "md" if content.lstrip().startswith("---") else "toml"


def _linked_agent(
    content: str, fmt: str, registry: ToolRegistry, credentials: Credentials
) -> tuple[list[Diagnostic], AgentDefinition | None]:
    """The diagnostics of an agent file written over a link, and its definition when it has no
    error: an HTTP caller's rules, and no agent of a kind that runs a command."""
    try:
        # Only to tell its kind: a process agent is named for what it is, not for the opt-in.
        kind = parse_definition(
            content, fmt, known_tools=registry.names(), allow_paths=False, allow_processes=True
        ).kind
    except DefinitionError:
        kind = AgentKind.BUILTIN  # the checks below say what is wrong with it
    if kind is not AgentKind.BUILTIN:
        return [_error(PROCESS_OVER_LINK.format(kind=kind.value))], None
    rules = {"known_tools": registry.names(), "skills": registry.skills}
    rules |= {"allow_processes": False, "credentials": credentials}
    diagnostics = agent_diagnostics(content, fmt, **rules)
    if has_errors(diagnostics):
        return diagnostics, None
    agent = parse_definition(content, fmt, allow_paths=False, **rules)
    if agent.name is None or not is_flow_name(agent.name):
        diagnostics.append(
            _error(
                f"over a link an agent is saved on the client as .salvor/agents/<name>.{fmt}, so "
                f"its `name` must be a file name (letters, digits, `.`, `_`, `-`, no `..`), not "
                f"{agent.name!r}"
            )
        )
        return diagnostics, None
    return diagnostics, agent


class ClientSaves:
    """The linked authoring calls over one store's ``definitions``; an agent is held to the
    operator's ``credentials`` as a local write holds it."""

    def __init__(self, definitions: Definitions, *, credentials: Credentials) -> None:
        self.definitions = definitions
        self.access = definitions.access
        self.credentials = credentials

    async def save_agent(self, session: FlowSession, content: str) -> dict:
        """Check an agent file (markdown, or TOML) written in the linked run of ``session``:
        ``{written, diagnostics}``, and when written its hash, its name and ``saved_to``. Any
        error diagnostic answers ``written: false`` with no directive; nothing is registered
        either way."""
        project = session.client_project
        if not project:
            return answer(False, [_error(NO_PROJECT.format(what="an agent file"))])
        fmt = _agent_format(content)
        known = self.definitions.registry
        diagnostics, agent = await off_loop(_linked_agent, content, fmt, known, self.credentials)
        if agent is not None:
            try:
                await self.definitions.build_agent(agent)
            except OperationRefused as exc:
                diagnostics.append(_error(exc.message))
                agent = None
        if agent is None:
            return answer(False, diagnostics)
        path = posixpath.join(project, ".salvor", "agents", f"{agent.name}.{fmt}")
        return {
            **answer(True, diagnostics),
            "agent": agent.agent_def_hash,
            "name": agent.name,
            "saved_to": client_file(path, content.encode("utf-8")),
        }

    async def save_graph(
        self, session: FlowSession, namespace: str, name: str, content: str
    ) -> dict:
        """Check a flow document written in the linked run of ``session`` as ``write_graph``
        does and as the link's pre-check would (against the files the call sent and those this
        run saved before): ``{written, diagnostics}``, and when written its hash, ``flow``
        (``namespace/name``) and ``saved_to``. Any error diagnostic answers ``written: false``
        with no directive; nothing is stored either way.

        Raises:
            ToolFailed: (retryable=False) ``namespace`` or ``name`` is not a name.
        """
        for field, value in (("namespace", namespace), ("name", name)):
            if not FLOW_NAME.fullmatch(value) or ".." in value:
                raise ToolFailed(
                    f"`{field}` must be 1 to 64 letters, digits, `_`, `-` or `.` (starting with a "
                    f"letter or digit, no `..`), not {value[:80]!r}",
                    retryable=False,
                )
        project = session.client_project
        if not project:
            return answer(False, [_error(NO_PROJECT.format(what="a flow"))])
        graph, nodes = await off_loop(parsed_graph, content)
        access = self.access
        known = self.definitions.registry.names()
        agents, registered = await access.read(graph_agents, access.store, nodes, known)
        if graph is None:
            failed = await off_loop(graph_diagnostics, content, agents, registered)
            return answer(False, failed)
        path = posixpath.join(project, ".salvor", "flows", f"{name}.yaml")
        files = await self._files(session, path, content.encode("utf-8"))
        parse = self.definitions.agent_parser()
        # Parsing and checking untrusted text is CPU, kept off the trio thread.
        diagnostics = await off_loop(graph_diagnostics, content, agents, registered)
        diagnostics += await off_loop(_link_problems, content, graph.nodes, agents, files, parse)
        if has_errors(diagnostics):
            return answer(False, diagnostics)
        return {
            **answer(True, diagnostics),
            "graph": graph.hash,
            "flow": f"{namespace}/{name}",
            "saved_to": client_file(path, content.encode("utf-8")),
        }

    async def _files(self, session: FlowSession, path: str, data: bytes) -> FlowFiles:
        """The written flow at ``path`` as a linked run would be given it: the files the call
        sent with the run, and every file this run saved before (by the key a node reaching it
        would give), so the pre-check reads what the client will hold."""
        members: dict[str, FlowMember] = {}
        contents: dict[str, bytes] = {}
        # A graph run's head names the files the call sent; a map item or a child has none.
        manifest = await self.definitions.run_flow(session.run_id)
        if manifest is not None:
            sent = await self.definitions.load_flow_files(manifest)
            members.update(sent.bundle.members)
            contents.update(sent.contents)
        log = await self.access.read(self.access.store.read_log, session.run_id)
        saved = {saved_path: saved_data for _, saved_path, saved_data in saved_files(log)}
        saved[path] = data
        _add_saved(members, contents, saved, path, session.client_project or "")
        document = content_hash(data)
        contents[document] = data
        bundle = FlowBundle(
            path=path,
            canonical=path,
            spelling={"state": "listed"},
            document=document,
            members=members,
            linked=True,
        )
        return FlowFiles(bundle, contents)


def _link_problems(
    content: str,
    nodes: tuple[GraphNode, ...],
    agents: dict[str, AgentDefinition],
    files: FlowFiles,
    parse_agent: AgentParser,
) -> list[Diagnostic]:
    """What a linked run of the flow ``content`` (its ``files``) would be refused for."""
    checked = check_flow(files, parse_agent)
    return _process_nodes(content, nodes, agents) + _link_diagnostics(
        content, files.bundle.canonical, checked.errors
    )


def _process_nodes(
    content: str, nodes: tuple[GraphNode, ...], agents: dict[str, AgentDefinition]
) -> list[Diagnostic]:
    """An error for each node naming by hash a registered agent that runs a command."""
    errors = []
    for node in nodes:
        call = node.body if node.body is not None else node
        agent = agents.get(call.agent) if call.agent is not None else None
        if agent is not None and agent.kind is not AgentKind.BUILTIN:
            errors.append(
                GraphError(
                    code="process_agent_over_link",
                    node=node.id,
                    message=f"node {node.id!r}: the agent {call.agent} is a {agent.kind.value} "
                    "agent, whose command would run on the daemon's machine; a flow sent over a "
                    "link runs built-in agents only",
                )
            )
    return graph_error_diagnostics(content, errors)


def _link_diagnostics(content: str, path: str, errors: list[GraphError]) -> list[Diagnostic]:
    """The pre-check's errors as diagnostics of the written document: a file neither sent with
    the call nor saved by this run cannot be checked here (the client sends it when the flow
    runs), so its absence is a warning; every other problem is an error."""
    found = []
    for error in errors:
        own = error.extra.get("file") == path
        shown = error if own else GraphError(code=error.code, message=error.message)
        (diagnostic,) = graph_error_diagnostics(content, [shown])
        if error.code == "unknown_member":
            diagnostic = Diagnostic(
                diagnostic.line,
                Severity.WARNING,
                f"not checked on the daemon: {error.message} with this run; the client sends "
                "it when the flow runs",
            )
        found.append(diagnostic)
    return found


def _add_saved(
    members: dict[str, FlowMember],
    contents: dict[str, bytes],
    saved: dict[str, bytes],
    path: str,
    project: str,
) -> None:
    """Add to ``members`` each file the flow at ``path`` (and each saved flow it nests) reaches
    that this run saved; a target outside the project is refused as the client would refuse
    it. A target neither sent nor saved is left out (the pre-check names it)."""
    roots = (project, posixpath.join(project, ".salvor", "flows"))
    pending, seen = [path], set()
    while pending:
        current = pending.pop()
        if current in seen or current not in saved:
            continue
        seen.add(current)
        for role, key, target_path, target in _reached(current, saved[current], project):
            # What this run saved is what the client will hold, whatever the call sent.
            if target_path in saved:
                data = saved[target_path]
                digest = content_hash(data)
                contents[digest] = data
                members[key] = FlowMember(
                    key=key,
                    role=role,
                    path=target_path,
                    canonical=target_path,
                    sha256=digest,
                    size=len(data),
                )
                if role == "flow":
                    pending.append(target_path)
            elif key not in members and not _under(target_path, project):
                members[key] = FlowMember(
                    key=key,
                    role=role,
                    path=target_path,
                    canonical=target_path,
                    state="refused",
                    error=f"{target} is outside every root this client serves ({', '.join(roots)})",
                )


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _reached(path: str, data: bytes, project: str) -> list[tuple[str, str, str, str]]:
    """The agent files and nested flows the flow document ``data`` at ``path`` names: (role,
    key, path, target as written); none for a document that does not parse."""
    try:
        graph = parse_flow_document(data, path)
    except InvalidGraph:  # the pre-check reports what is wrong with it
        return []
    directory = posixpath.dirname(path)
    reached = []
    for node in graph.nodes:
        call = node.body if node.body is not None else node
        if call.kind is NodeKind.AGENT and call.agent_file is not None:
            target = call.agent_file
            key = member_key(directory, target)
            reached.append(("agent", key, member_path(directory, target), target))
        elif call.kind is NodeKind.FLOW and call.flow is not None and project:
            target = f"{call.flow}.yaml"
            flows = posixpath.join(project, ".salvor", "flows")
            key = nested_flow_key(project, call.flow)
            reached.append(("flow", key, posixpath.join(flows, target), target))
    return reached
