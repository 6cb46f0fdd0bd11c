"""What the flow tools ask of the daemon besides child runs: edit mode, the read-only views of a
run's tree (``flow_results``), the agent catalog, and registering what an agent authors
(``flow_agents`` write, ``flow_write``).

A part of the flow host (the class that carries out a run's flow tools inherits it), kept apart
because none of it drives anything. ``flow_results`` reads only: every action runs on a reader
thread and writes nothing, whatever it is asked. The authoring calls check first and record
second: a definition or a graph with an error diagnostic leaves the store as it was.

The run tree is read from labels: a run's children are the runs labelled ``salvor.parent`` with
its id (the subagents it started, and any graph run it started). The graphs a run wrote with
``flow_write`` are read back from its own log, where each write's recorded answer names the
graph's hash and its ``namespace/name``: the log is where the name was given, so no other table
has to remember it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from salvor.protocol import (
    Diagnostic,
    Envelope,
    Graph,
    InvalidGraph,
    NodeEntered,
    NodeExited,
    NodeSkipped,
    ResultsAction,
    RunState,
    Severity,
    ToolCallCompleted,
    ToolCallRequested,
    excerpt,
    graph_from_value,
    project_graph,
    run_result,
)
from salvor.store import EventStore, RunSummary, StoredAgent

from ..agents import (
    AgentDefinition,
    Credentials,
    DefinitionError,
    agent_diagnostics,
    graph_diagnostics,
    parse_definition,
)
from ..flows import PARENT_LABEL, FlowSession
from ..processes import kill_if_requested
from ..tools import ToolFailed, ToolRegistry
from ..web import OperationRefused, off_loop
from ._authoring import FLOW_NAME, answer, graph_agents, has_errors, parsed_graph
from ._definitions import Definitions
from ._flow_result_words import flow_name_of, newest_run_of_flow, unknown_word

# How much of a summary a listing shows; ``agent`` shows it whole.
SUMMARY_CHARS = 500
# The tool whose recorded answers name the graphs a run wrote.
_FLOW_WRITE = "flow_write"
# The tool whose recorded answers name the agents a run wrote.
_FLOW_AGENTS = "flow_agents"
# Where a catalog entry's agent came from (``catalog_entry``).
LOCAL, STORE = "local", "store"
# How a node or a run stands, as flow_results reports it.
PENDING, RUNNING, FINISHED = "pending", "running", "finished"
_TERMINAL = frozenset({RunState.COMPLETED.value, RunState.FAILED.value, RunState.ABANDONED.value})


class FlowCatalog:
    """Edit mode, ``flow_results``, the catalog and authoring, over one store's ``definitions``;
    an authored agent is held to the operator's ``credentials``."""

    def __init__(self, definitions: Definitions, *, credentials: Credentials) -> None:
        self.definitions = definitions
        self.access = definitions.access
        self.credentials = credentials

    async def edit_mode(self) -> bool:
        """Whether the operator has authoring on (``Definitions.edit_mode``: read afresh each
        time)."""
        return await self.definitions.edit_mode()

    async def flow_results(self, session: FlowSession, args: Mapping[str, Any]) -> dict:
        """A read-only view of ``session``'s run tree; ``args`` is the tool's input
        (``{action, flow?, agent?}``, already checked against its schema).

        Raises:
            ToolFailed: (retryable=False) ``flow`` or ``agent`` names nothing in the tree (the
                message lists what does), or an action lacks the field it needs. Nothing is
                written on any path.
        """
        access = self.access
        return await access.read(_results, access.store, session.run_id, dict(args))

    async def agent_catalog(self) -> list[dict]:
        """The catalog ``flow_agents list`` answers: one entry per agent name, the newest
        registration of each (ordered by it, oldest first), as ``catalog_entry`` describes it.
        An agent registered without a name is reached by its hash only and is not listed."""
        access = self.access
        return await access.read(_catalog, access.store, self.definitions.registry.names())

    async def write_agent(self, content: str, *, author: str | None = None) -> dict:
        """Check a markdown agent file and register it: ``{written, diagnostics}``, and when
        written the agent's hash, its name and whether it was new (``created``).

        The file is held to what an HTTP caller may send (no file of the daemon's disk, no
        command to run, only the model endpoints and MCP origins the operator declared), and it
        is built as ``POST /v1/agents`` builds one. Its name must be free, or the run ``author``
        (the writing run's id; None: no run) must have written every agent holding it: a name
        is what a subagent call and the catalog find an agent by (its newest registration), so
        an authored agent taking another's name would stand in for it (issue 29, item 6). Any
        error diagnostic, from the checks, the build or the name, leaves the store as it was
        (``written: false``).
        """
        known = self.definitions.registry
        # Parsing and checking the text (and finding its skills) stays off the trio thread.
        diagnostics, agent = await off_loop(_checked_agent, content, known, self.credentials)
        if agent is not None:
            try:
                await self.definitions.build_agent(agent)
            except OperationRefused as exc:
                diagnostics.append(Diagnostic(1, Severity.ERROR, exc.message))
                agent = None
        if agent is not None and agent.name:
            access = self.access
            holders = await access.read(_name_held_by_others, access.store, agent, author)
            if holders:
                diagnostics.append(Diagnostic(1, Severity.ERROR, _name_taken(agent.name, holders)))
                agent = None
        if agent is None:
            return answer(False, diagnostics)
        created = await self.definitions.register_agent(agent)
        return {
            **answer(True, diagnostics),
            "agent": agent.agent_def_hash,
            "name": agent.name,
            "created": created,
        }

    async def write_graph(
        self, namespace: str, name: str, content: str, *, author: str | None = None
    ) -> dict:
        """Check a graph document (YAML, or JSON), store it content-addressed and keep it as
        ``namespace/name``: ``{written, diagnostics}``, and when written its hash (``graph``), the
        name (``flow``), whether the graph was new (``created``), the version the name now stands
        at (``version``) and whether this write made it (``new_version``: false when the name's
        current version already had this graph). ``author`` is the writing run's id.

        Writing a name again with another graph is a new version; the older ones stay kept, so a
        run started on one walks it to its end. The run's log records this answer as the call's
        output too (``flow_results`` reads it there). Any error diagnostic leaves the store as it
        was (``written: false``).

        Raises:
            ToolFailed: (retryable=False) ``namespace`` or ``name`` is not a name.
        """
        for field, value in (("namespace", namespace), ("name", name)):
            if not FLOW_NAME.fullmatch(value):
                raise ToolFailed(
                    f"`{field}` must be 1 to 64 letters, digits, `_`, `-` or `.` (starting with a "
                    f"letter or digit), not {excerpt(value, 80)!r}",
                    retryable=False,
                )
        access = self.access
        known = self.definitions.registry.names()
        # The text is parsed and checked on an untrusted-work thread, not on one of the store's
        # readers (a near-limit document takes seconds, and reads would queue behind it); only
        # the lookup of the agents its nodes name reads the store.
        graph, nodes = await off_loop(parsed_graph, content)
        agents, registered = await access.read(graph_agents, access.store, nodes, known)
        diagnostics = await off_loop(graph_diagnostics, content, agents, registered)
        if graph is None or has_errors(diagnostics):
            return answer(False, diagnostics)
        created = await self.definitions.register_graph(graph)
        naming = await self.definitions.flow_names.name(namespace, name, graph.hash, run_id=author)
        # SALVOR_FAULT_KILL_IN_TOOL=flow_write (the kill suites): dead here, the flow named and
        # the call not yet completed, so recovery performs it again.
        kill_if_requested(_FLOW_WRITE)
        return {
            **answer(True, diagnostics),
            "graph": graph.hash,
            "flow": f"{namespace}/{name}",
            "created": created,
            "version": naming.version,
            "new_version": naming.created,
        }


# -- authoring: checks on a worker thread ---------------------------------------------------------


def _name_held_by_others(
    store: EventStore, agent: AgentDefinition, author: str | None
) -> list[str]:
    """The hashes of the other registered agents named as ``agent`` is that the run ``author``
    did not write itself (read from its log, as ``_flows_written`` reads its graphs)."""
    others = [
        stored.agent_def_hash
        for stored in store.definitions.list_agents()
        if stored.name == agent.name and stored.agent_def_hash != agent.agent_def_hash
    ]
    if not others or author is None:
        return others
    own = _agents_written(store.read_log(author))
    return [held for held in others if held not in own]


def _name_taken(name: str, holders: list[str]) -> str:
    return (
        f"the name {name!r} is already taken by another agent ({holders[-1]}), which this run "
        "did not write; an agent written in edit mode takes a name of its own (or one this run "
        "gave an agent it wrote), so it never stands in for another under that name"
    )


def _agents_written(log: list[Envelope]) -> set[str]:
    """The hashes of the agents a run registered with ``flow_agents`` write."""
    writes = {
        envelope.seq
        for envelope in log
        if isinstance(envelope.event, ToolCallRequested) and envelope.event.tool == _FLOW_AGENTS
    }
    written: set[str] = set()
    for envelope in log:
        event = envelope.event
        if isinstance(event, ToolCallCompleted) and event.seq in writes:
            output = event.output
            if (
                isinstance(output, dict)
                and output.get("written") is True
                and isinstance(output.get("agent"), str)
            ):
                written.add(output["agent"])
    return written


def _checked_agent(
    content: str, registry: ToolRegistry, credentials: Any
) -> tuple[list[Diagnostic], AgentDefinition | None]:
    """The diagnostics of a markdown agent file, and the definition when it has no error."""
    # What an HTTP caller may send, no more: a model's file is no more trusted than a caller.
    rules = {"known_tools": registry.names(), "skills": registry.skills}
    rules |= {"allow_processes": False, "credentials": credentials}
    diagnostics = agent_diagnostics(content, "md", **rules)
    if has_errors(diagnostics):
        return diagnostics, None
    return diagnostics, parse_definition(content, "md", allow_paths=False, **rules)


def _catalog(store: EventStore, known_tools: Any) -> list[dict]:
    newest: dict[str, StoredAgent] = {}
    for stored in store.definitions.list_agents():
        if stored.name:
            newest.pop(stored.name, None)  # re-inserted last: the newest registration wins
            newest[stored.name] = stored
    entries = []
    # In the order of each name's newest registration, oldest first.
    for stored in newest.values():
        try:
            agent = parse_definition(
                stored.definition, stored.format, known_tools=known_tools, stored=True
            )
        except DefinitionError:
            continue  # it no longer builds here (a tool this daemon lacks): nothing can run it
        entries.append(catalog_entry(agent, source_path=stored.source_path))
    return entries


def catalog_entry(agent: AgentDefinition, *, source_path: str | None = None) -> dict:
    """An agent as the catalog lists it: ``name``, ``description``, ``tools`` (its registry
    tools and the flow tools it opted into), ``skills``, ``inputs`` (names), ``outputs`` (name,
    type and description), ``source_type`` and, for a local one, ``source_path``, ``architect`` (a
    markdown file's, ``{}`` when it declares none), ``agent`` (its hash), ``kind``, and a
    markdown file's ``card`` when it has one.

    ``source_type``: ``"local"`` for an agent read from a file (``source_path``: a flow's agent
    file as its flow names it, or the file a local ``salvor run``/``salvor graph run --agent``
    read), ``"store"`` for one registered over the API or written by a run. No agent ships with
    salvor, so none is ``"built-in"``."""
    outputs = []
    for output in agent.outputs:
        declared = {"name": output.name, "type": output.type}
        if output.description:
            declared["description"] = output.description
        outputs.append(declared)
    entry = {
        "name": agent.name,
        "description": agent.description or "",
        "tools": [*agent.tools, *(tool.value for tool in agent.flow_tools)],
        "skills": list(agent.skills),
        "inputs": [declared.name for declared in agent.inputs],
        "outputs": outputs,
        "source_type": LOCAL if source_path is not None else STORE,
    }
    if source_path is not None:
        entry["source_path"] = source_path
    entry["architect"] = dict(agent.architect or {})
    entry["agent"] = agent.agent_def_hash
    entry["kind"] = agent.kind.value
    # A markdown file's display metadata, when it has some.
    if agent.card is not None:
        entry["card"] = agent.card
    return entry


# -- the tree, read on a reader thread ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tree:
    """One run's tree as ``flow_results`` sees it: its children, and the names it can use."""

    store: EventStore
    run_id: str
    # Newest first, as the store lists them.
    children: list[RunSummary]
    # Agent hash -> name, for the agents the children run.
    names: dict[str, str]
    # "namespace/name" -> graph hash, the graphs this run wrote (the newest write of a name).
    flows: dict[str, str]

    def label(self, child: RunSummary) -> dict:
        """What a child runs: ``agent`` (its name, else its hash), or ``graph`` (and ``flow``)."""
        if child.graph_hash is not None:
            body = {"graph": child.graph_hash}
            named = [name for name, graph in self.flows.items() if graph == child.graph_hash]
            if flow_name_of(child) or named:
                body["flow"] = flow_name_of(child) or named[-1]
            return body
        if child.agent_def_hash is None:
            return {}
        return {"agent": self.names.get(child.agent_def_hash) or child.agent_def_hash}

    def known(self) -> list[str]:
        """Every word ``flow`` may be: the children's ids, their agents' names, the flows."""
        words = [child.run_id for child in self.children]
        words += sorted({self.names[c.agent_def_hash] for c in self.children if self._named(c)})
        return words + list(self.flows)

    def _named(self, child: RunSummary) -> bool:
        return child.agent_def_hash is not None and child.agent_def_hash in self.names

    def find(self, flow: str) -> RunSummary:
        """The child ``flow`` names: its run id, an agent's name (its newest child), a flow's
        ``namespace/name`` or its graph hash (its newest graph run); else the newest run started
        by the flow name ``flow`` (``newest_run_of_flow``).

        Raises:
            ToolFailed: nothing in the tree answers to ``flow``, and no run of a flow by that name.
        """
        graph = self.flows.get(flow, flow)
        for child in self.children:
            if flow in (child.run_id, child.agent_def_hash, flow_name_of(child)):
                return child
            if child.graph_hash == graph:
                return child
            if self._named(child) and self.names[child.agent_def_hash] == flow:
                return child
        by_name = newest_run_of_flow(self.store, flow)
        if by_name is not None:
            return by_name
        message = f"no run in this run's tree answers to `flow` {flow!r}"
        raise unknown_word(message, flow, self.known())


def _tree(store: EventStore, run_id: str) -> _Tree:
    children, _ = store.list_runs(label=(PARENT_LABEL, run_id))
    wanted = {child.agent_def_hash for child in children if child.agent_def_hash is not None}
    names = {
        agent.agent_def_hash: agent.name
        for agent in store.definitions.list_agents()
        if agent.agent_def_hash in wanted and agent.name
    }
    return _Tree(store, run_id, children, names, _flows_written(store.read_log(run_id)))


def _flows_written(log: list[Envelope]) -> dict[str, str]:
    """The graphs a run stored with ``flow_write``, by the name each write gave (newest wins)."""
    writes = {
        envelope.seq
        for envelope in log
        if isinstance(envelope.event, ToolCallRequested) and envelope.event.tool == _FLOW_WRITE
    }
    flows: dict[str, str] = {}
    for envelope in log:
        event = envelope.event
        if not isinstance(event, ToolCallCompleted) or event.seq not in writes:
            continue
        output = event.output
        if isinstance(output, dict) and output.get("written") is True:
            flow, graph = output.get("flow"), output.get("graph")
            if isinstance(flow, str) and isinstance(graph, str):
                flows.pop(flow, None)  # re-inserted last: the newest write of a name
                flows[flow] = graph
    return flows


def _results(store: EventStore, run_id: str, args: dict) -> dict:
    tree = _tree(store, run_id)
    action = ResultsAction(args["action"])
    if action is ResultsAction.LIST:
        return _list(tree)
    if action is ResultsAction.RUNS and "flow" not in args:
        return _runs(tree)
    if "flow" not in args:
        raise ToolFailed(f"action `{action.value}` needs `flow`", retryable=False)
    child = tree.find(args["flow"])
    if action is ResultsAction.SUMMARY:
        return _summary(tree, child)
    if action is ResultsAction.RUNS:
        return _run_state(tree, child)
    if "agent" not in args:
        raise ToolFailed("action `agent` needs `agent` as well as `flow`", retryable=False)
    return _agent(tree, child, args["agent"])


# -- results: what a finished run or node came to ------------------------------------------------


def _result(output: Any) -> dict:
    """A node's output as a finish result: what a run completed with it would come to."""
    return run_result(RunState.COMPLETED, {"output": output})


def _run_result(summary: RunSummary) -> dict | None:
    """What a child came to, None while it has not finished (or its row cannot be read)."""
    status = summary.status or {}
    try:
        state = RunState(status.get("state"))
    except ValueError:
        return None
    return run_result(state, status)


def _brief(result: dict | None) -> dict:
    """A result as a listing shows it: status, a bounded summary, the names of the outputs."""
    if result is None:
        return {}
    body = {
        "status": result["status"],
        "summary": excerpt(result["summary"], SUMMARY_CHARS),
        "outputs": sorted(result["outputs"]),
    }
    if "branch" in result:
        body["branch"] = result["branch"]
    return body


def _progress(state: str | None) -> str:
    return FINISHED if state in _TERMINAL else RUNNING


def _entry(tree: _Tree, child: RunSummary) -> dict:
    return {"run": child.run_id, **tree.label(child), "state": child.state or "unreadable"}


def _list(tree: _Tree) -> dict:
    results = [
        {**_entry(tree, child), **_brief(_run_result(child))}
        for child in tree.children
        if child.state in _TERMINAL
    ]
    flows = [{"flow": flow, "graph": graph} for flow, graph in tree.flows.items()]
    return {"results": results, "flows": flows}


# -- a graph run's nodes --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Node:
    node: str
    state: str
    name: str | None = None
    input: Any = None
    result: dict | None = None
    branch_case: str | None = None
    reason: str | None = None

    def brief(self) -> dict:
        body: dict[str, Any] = {"node": self.node}
        if self.name:
            body["name"] = self.name
        body["state"] = self.state
        if self.reason is not None:
            body["status"] = "skipped"
            body["summary"] = excerpt(self.reason, SUMMARY_CHARS)
        body.update(_brief(self.result))
        return body


def _graph_of(store: EventStore, graph_hash: str) -> Graph | None:
    stored = store.definitions.get_graph(graph_hash)
    if stored is None:
        return None
    try:
        return graph_from_value(stored.document)
    except InvalidGraph:
        return None  # stored only once valid; a document this build refuses shows no pending nodes


def _nodes(store: EventStore, child: RunSummary) -> list[_Node]:
    """A graph run's nodes in walk order, then the ones its walk has not reached (``pending``),
    each with the result its ``NodeExited`` recorded."""
    log = store.read_log(child.run_id)
    graph = _graph_of(store, child.graph_hash)
    names = {node.id: node.name for node in graph.nodes} if graph else {}
    projection = project_graph(child.graph_hash, log, graph=graph)
    entered: dict[str, Any] = {}
    exited: dict[str, NodeExited] = {}
    skipped: dict[str, str] = {}
    for envelope in log:
        event = envelope.event
        if isinstance(event, NodeEntered):
            entered[event.node] = event.input
        elif isinstance(event, NodeExited):
            exited[event.node] = event
        elif isinstance(event, NodeSkipped):
            skipped[event.node] = event.reason
    nodes = []
    for entry in projection["nodes"]:
        node_id = entry["node"]
        done = exited.get(node_id)
        nodes.append(
            _Node(
                node=node_id,
                state=RUNNING if entry["state"] == "entered" else FINISHED,
                name=names.get(node_id),
                input=entered.get(node_id),
                result=_result(done.output) if done is not None else None,
                branch_case=done.branch_case if done is not None else None,
                reason=skipped.get(node_id),
            )
        )
    reached = {node.node for node in nodes}
    ordered = graph.order if graph else ()
    nodes += [
        _Node(node_id, PENDING, names.get(node_id)) for node_id in ordered if node_id not in reached
    ]
    return nodes


# -- the actions ----------------------------------------------------------------------------------


def _summary(tree: _Tree, child: RunSummary) -> dict:
    """``summary``: each step of ``child`` (a graph run's nodes; an agent run is one step)."""
    if child.graph_hash is not None:
        steps = [node.brief() for node in _nodes(tree.store, child) if node.state != PENDING]
    else:
        steps = [
            {
                "step": tree.label(child).get("agent"),
                "state": _progress(child.state),
                **_brief(_run_result(child)),
            }
        ]
    return {**_entry(tree, child), "steps": steps}


def _agent(tree: _Tree, child: RunSummary, agent: str) -> dict:
    """``agent``: one node of a graph run (by id or name), or an agent run's own step, in full
    under ``step``."""
    if child.graph_hash is not None:
        nodes = _nodes(tree.store, child)
        for node in nodes:
            if agent in (node.node, node.name):
                return {**_entry(tree, child), "step": _full_node(node)}
        known = [node.node for node in nodes] + [node.name for node in nodes if node.name]
        raise unknown_word(f"graph run {child.run_id} has no node {agent!r}", agent, known)
    named = tree.label(child).get("agent")
    if agent not in (named, child.agent_def_hash):
        raise unknown_word(
            f"run {child.run_id} runs the agent {named!r}, not {agent!r}", agent, [named]
        )
    view = tree.store.read_view(child.run_id)
    step: dict[str, Any] = {
        "step": named,
        "state": _progress(child.state),
        "input": view.input if view else None,
    }
    step.update(_run_result(child) or {})
    step["usage"] = child.usage
    step["step_count"] = child.step_count
    return {**_entry(tree, child), "step": step}


def _full_node(node: _Node) -> dict:
    body: dict[str, Any] = {"node": node.node}
    if node.name:
        body["name"] = node.name
    body["state"] = node.state
    if node.state != PENDING:
        body["input"] = node.input
    if node.reason is not None:
        body.update(status="skipped", summary=node.reason, outputs={})
    if node.result is not None:
        body.update(node.result)
    if node.branch_case is not None:
        body["branch_case"] = node.branch_case
    return body


def _counts(states: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return dict(sorted(counts.items()))


def _runs(tree: _Tree) -> dict:
    """``runs`` with no flow: every child, live or finished, and how many are in each state;
    a graph run with its nodes counted by state too."""
    runs = []
    for child in tree.children:
        entry = _entry(tree, child)
        if child.graph_hash is not None:
            entry["nodes"] = _counts([node.state for node in _nodes(tree.store, child)])
        runs.append(entry)
    return {"runs": runs, "counts": _counts([entry["state"] for entry in runs])}


def _run_state(tree: _Tree, child: RunSummary) -> dict:
    """``runs`` with a flow: that run's per-node state (an agent run is one node)."""
    if child.graph_hash is not None:
        nodes = [node.brief() for node in _nodes(tree.store, child)]
    else:
        nodes = [
            {
                "node": tree.label(child).get("agent"),
                "state": _progress(child.state),
                **_brief(_run_result(child)),
            }
        ]
    return {**_entry(tree, child), "nodes": nodes}
