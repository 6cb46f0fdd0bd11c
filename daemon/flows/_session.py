"""A run's flow session: where it stands in its tree, what its agent opted into, and the host
that carries out what a tool cannot do alone (start a child run, read the run tree, register).

Labels mark the tree, written by the daemon when it starts a child: ``salvor.parent`` (a
subagent's child names its parent run), ``salvor.map_of`` (a map item names its graph run), and
``salvor.autonomous`` (``"true"``: nobody answers questions in this tree; set by whoever starts the
top-level run, inherited by every child the daemon starts for it), and ``salvor.linked`` (the run
tree came over a link: its value is the client's project root, or empty when the flow lies in
no project; written by the daemon at ``POST /v1/graph-runs`` with ``X-Salvor-Linked``, inherited
like ``salvor.autonomous``, so recovery, forks and children all see it in their heads), and
``salvor.tools`` (the registry tools attached to the tree at run time before the child started,
comma-separated: its parent's own label and the ``ToolsAttached`` its parent's log held then).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from salvor.protocol import DeclaredOutput, FlowTool, Session

# A subagent's child run names its parent here; the parent's drive drives it.
PARENT_LABEL = "salvor.parent"
# A map item names the graph run whose walk drives it.
MAP_OF_LABEL = "salvor.map_of"
# "true" on a run tree nobody answers questions in: ask_user is refused in its child sessions.
AUTONOMOUS_LABEL = "salvor.autonomous"
# A run tree started over a link; the value is the client's project root ("" when none).
LINKED_LABEL = "salvor.linked"
# A graph run started by a flow's name (``flow_name``); the value is its ``namespace/name``.
FLOW_LABEL = "salvor.flow"
# The registry tools attached to the tree before this run started (comma-separated names).
TOOLS_LABEL = "salvor.tools"
# The labels only the daemon writes; a caller may set AUTONOMOUS_LABEL, never these.
DAEMON_LABELS = frozenset({PARENT_LABEL, MAP_OF_LABEL, LINKED_LABEL, FLOW_LABEL, TOOLS_LABEL})
# The namespace of subagent children's run ids (uuid5 over "<parent run>/<call seq>").
SUBAGENTS = uuid.UUID("3b8e2f64-1c7d-5a09-8e4f-6d2a9c1b7e53")


def child_run_id(parent: str, seq: int) -> str:
    """The run id of the child a subagent call at ``seq`` of run ``parent`` starts: the same on
    every re-execution of that call, so a crash never starts a second child."""
    return str(uuid.uuid5(SUBAGENTS, f"{parent}/{seq}"))


def session_of(labels: Mapping[str, str] | None, *, graph_node: bool = False) -> Session:
    """The session a run's conversation holds: a child when something else started the run for
    its own ends (a parent's subagent call, a map) or it is a graph's agent node."""
    labels = labels or {}
    if graph_node or PARENT_LABEL in labels or MAP_OF_LABEL in labels:
        return Session.CHILD
    return Session.MAIN


def is_autonomous(labels: Mapping[str, str] | None) -> bool:
    return (labels or {}).get(AUTONOMOUS_LABEL) == "true"


def inherited_labels(
    labels: Mapping[str, str] | None, attached: Sequence[str] = ()
) -> dict[str, str]:
    """What a child run the daemon starts takes from the run that starts it; ``attached``: the
    tools the starting run's own log attached before the child starts."""
    labels = labels or {}
    inherited = {AUTONOMOUS_LABEL: "true"} if is_autonomous(labels) else {}
    if LINKED_LABEL in labels:
        inherited[LINKED_LABEL] = labels[LINKED_LABEL]
    tools = tree_tools(labels, attached)
    if tools:
        inherited[TOOLS_LABEL] = ",".join(tools)
    return inherited


def tree_tools(labels: Mapping[str, str] | None, attached: Sequence[str] = ()) -> tuple[str, ...]:
    """The tools attached to a run's tree: those its head inherited, then ``attached`` (its own
    log's), each once, in order."""
    inherited = (labels or {}).get(TOOLS_LABEL) or ""
    names = [name for name in inherited.split(",") if name]
    return tuple(dict.fromkeys([*names, *attached]))


def with_tools(labels: Mapping[str, str] | None, attached: Sequence[str]) -> dict[str, str] | None:
    """``labels`` as a run whose own log attached ``attached`` hands them on (``salvor.tools``
    holding the tree's tools), for ``inherited_labels`` of the children it starts."""
    tools = tree_tools(labels, attached)
    if not tools:
        return None if labels is None else dict(labels)
    return {**(labels or {}), TOOLS_LABEL: ",".join(tools)}


def client_project(labels: Mapping[str, str] | None) -> str | None:
    """The client's project root of a linked run tree ("" when its flow lies in no project),
    None for a run that did not come over a link."""
    return (labels or {}).get(LINKED_LABEL)


class FlowHost(Protocol):
    """What the flow tools ask of the daemon above them (``runs.RunFlows`` implements it).

    Every method may raise ``ToolFailed`` (``retryable=False`` when asking again cannot help):
    the tool call records it as its error and the model is told.
    """

    async def edit_mode(self) -> bool:
        """Whether the operator has authoring on; read afresh at every agent turn."""
        ...

    async def run_child(
        self, parent: FlowSession, seq: int, agent: str, task: str, inputs: Mapping[str, str]
    ) -> dict:
        """Start (once: its id derives from ``parent`` and ``seq``) and drive a child run of the
        catalog agent ``agent``; its finish result (``status``, ``summary``, ``outputs``).

        Raises:
            NotPerformed: the child rests short of a result (waiting on a person, a timer, a
                write to reconcile); the parent's call stays open and is asked again when the
                child ends.
            StoreUnavailable: the store failed under the child (a ``store_fault``); the
                parent's drive stops on it as its own, and is healed from the tree's root.
        """
        ...

    async def flow_results(self, session: FlowSession, args: Mapping[str, Any]) -> Any:
        """A read-only view of ``session``'s run tree (``flow_results``'s actions)."""
        ...

    async def agent_catalog(self) -> list[dict]:
        """The agent catalog, one entry per name (``flow_agents`` ``list``)."""
        ...

    async def write_agent(self, content: str, *, author: str | None = None) -> dict:
        """Validate and register an agent file: ``{written, diagnostics}``; its name must be
        free, or held only by agents the run ``author`` wrote."""
        ...

    async def write_graph(
        self, namespace: str, name: str, content: str, *, author: str | None = None
    ) -> dict:
        """Validate and store a graph document and keep it as ``namespace/name`` (a new version
        when the graph differs): ``{written, diagnostics}``; ``author`` is the writing run."""
        ...

    async def save_agent(self, session: FlowSession, content: str) -> dict:
        """In a linked run: validate an agent file, refusing what a linked run would, and
        answer ``{written, diagnostics}`` with ``saved_to``, the file for the client to write;
        nothing is registered here."""
        ...

    def registry_tool(self, name: str) -> Any:
        """The daemon's registry tool ``name`` (a ``tools.Tool``), or None: what an attached
        name offers."""
        ...

    async def attach_tools(self, session: FlowSession, names: Sequence[str]) -> dict:
        """An agent's ``attach_tool``: check ``names`` against the operator's allow-list and the
        registry, and answer ``{attached}`` (the call's recorded answer is the attachment: the
        run offers them from its next model call, and children it starts after inherit them).

        Raises:
            ToolFailed: a name outside the allow-list or unknown to the registry
                (retryable=False); nothing is attached.
        """
        ...

    async def save_graph(
        self, session: FlowSession, namespace: str, name: str, content: str
    ) -> dict:
        """In a linked run: validate a flow document as ``write_graph`` does and as the link's
        pre-check would, answering ``saved_to`` for the client; nothing is stored here."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowSession:
    """One run's view of the flow tools: who it is, what it may call, what its finish carries.

    ``branches``: the names a graph agent node's finish must choose among (an agent-decision
    step), else None. ``host``: None where no daemon stands behind the run (a ``salvor run`` of
    one agent file): the tools that need one are then not offered. ``client_project``: for a
    run tree that came over a link, the client's project root ("" when none), else None.
    """

    run_id: str
    session: Session
    autonomous: bool = False
    opted_in: tuple[FlowTool, ...] = ()
    outputs: tuple[DeclaredOutput, ...] = ()
    branches: Sequence[str] | None = None
    host: FlowHost | None = None
    client_project: str | None = None
    # The registry tools attached to the run's tree so far (``tree_tools``): a child it starts
    # inherits them.
    attached: tuple[str, ...] = ()

    @property
    def linked(self) -> bool:
        """Whether the run tree came over a link (what it authors is saved on the client)."""
        return self.client_project is not None
