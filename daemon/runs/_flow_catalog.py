"""What the flow tools ask of the daemon besides child runs: edit mode, the read-only views of a
run's tree (``flow_results``, read in ``_flow_results``), the agent catalog, and registering what
an agent authors (``flow_agents`` write, ``flow_write``).

A part of the flow host (the class that carries out a run's flow tools inherits it), kept apart
because none of it drives anything. The authoring calls check first and record second: a
definition or a graph with an error diagnostic leaves the store as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from salvor.protocol import (
    Diagnostic,
    Envelope,
    Severity,
    ToolCallCompleted,
    ToolCallRequested,
    excerpt,
)
from salvor.store import EventStore, StoredAgent

from ..agents import (
    AgentDefinition,
    Credentials,
    DefinitionError,
    agent_diagnostics,
    graph_diagnostics,
    parse_definition,
)
from ..flows import FlowSession
from ..processes import kill_if_requested
from ..tools import ToolFailed, ToolRegistry
from ..web import OperationRefused, off_loop
from ._authoring import FLOW_NAME, answer, graph_agents, has_errors, parsed_graph
from ._definitions import Definitions
from ._flow_results import FLOW_WRITE, tree_results

# The tool whose recorded answers name the agents a run wrote.
_FLOW_AGENTS = "flow_agents"
# Where a catalog entry's agent came from (``catalog_entry``).
LOCAL, STORE = "local", "store"


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
        return await access.read(tree_results, access.store, session.run_id, dict(args))

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
        kill_if_requested(FLOW_WRITE)
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
    did not write itself (read from its log, as ``flow_results`` reads the graphs it wrote)."""
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
