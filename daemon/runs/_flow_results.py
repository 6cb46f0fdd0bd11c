"""The read-only views ``flow_results`` gives of a run's tree: what its children ran, how each
stands, and what each finished run or graph node came to.

Every view is read on a store reader thread and writes nothing, whatever it is asked. The run
tree is read from labels: a run's children are the runs labelled ``salvor.parent`` with its id
(the subagents it started, and any graph run it started). The graphs a run wrote with
``flow_write`` are read back from its own log, where each write's recorded answer names the
graph's hash and its ``namespace/name``: the log is where the name was given, so no other table
has to remember it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from salvor.protocol import (
    Envelope,
    Graph,
    InvalidGraph,
    NodeEntered,
    NodeExited,
    NodeSkipped,
    ResultsAction,
    RunState,
    ToolCallCompleted,
    ToolCallRequested,
    excerpt,
    graph_from_value,
    project_graph,
    run_result,
)
from salvor.store import EventStore, RunSummary

from ..flows import PARENT_LABEL
from ..tools import ToolFailed
from ._flow_result_words import flow_name_of, newest_run_of_flow, unknown_word

# How much of a summary a listing shows; ``agent`` shows it whole.
SUMMARY_CHARS = 500
# The tool whose recorded answers name the graphs a run wrote.
FLOW_WRITE = "flow_write"
# How a node or a run stands, as flow_results reports it.
PENDING, RUNNING, FINISHED = "pending", "running", "finished"
_TERMINAL = frozenset({RunState.COMPLETED.value, RunState.FAILED.value, RunState.ABANDONED.value})


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
        if isinstance(envelope.event, ToolCallRequested) and envelope.event.tool == FLOW_WRITE
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


def tree_results(store: EventStore, run_id: str, args: dict) -> dict:
    """``flow_results`` of run ``run_id``'s tree; ``args`` is the tool's checked input.

    Raises:
        ToolFailed: (retryable=False) ``flow`` or ``agent`` names nothing in the tree, or an
            action lacks the field it needs. Nothing is written on any path.
    """
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
