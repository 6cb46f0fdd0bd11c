"""The flow tools' host every drive is handed (``DriveKit.flows``): a subagent call's child run,
started once and driven inline by the parent's call (``run_child``); the read and authoring side
is ``FlowCatalog``'s.

A child's id derives from its parent's run and the call's seq (``child_run_id``), and its head
is appended once: a parent re-executing its open call after a crash finds the child the killed
drive started and drives it on from its log, so no second child ever exists. The head names the
parent (``salvor.parent``) and carries what a child inherits (``salvor.autonomous``,
``salvor.linked``).

The call's result is the child's: its finish result when its RunCompleted output is one, else its
answer as a text result; a failed or abandoned child answers with an ``error`` result, so the
parent's model decides what to do. A child resting short of an end (a question, a budget, a
write to reconcile, a timer) leaves the parent's call open (``NotPerformed``); the driver set
starts the parent again when the child ends. A store fault under the child is raised as itself:
the parent's drive stops on it, and the healer re-drives the tree from its root.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from salvor.protocol import (
    EMPTY_VIEW,
    CodedError,
    RunStarted,
    RunState,
    RunView,
    run_result,
)
from salvor.store import SeqConflict, StoredAgent, store_fault

from ..agents import Credentials
from ..flows import (
    AUTONOMOUS_LABEL,
    LINKED_LABEL,
    PARENT_LABEL,
    FlowSession,
    child_run_id,
    inherited_labels,
)
from ..mcp import McpServerSpec
from ..tools import NotPerformed, Tool, ToolFailed, ToolRegistry
from ..web import OperationRefused
from ._client_saves import ClientSaves
from ._definitions import Definitions
from ._flow_catalog import FlowCatalog
from ._run_reads import RunReads
from ._run_tools import agent_attach

HASH_PREFIX = "sha256:"


def child_result(view: RunView) -> dict:
    """The subagent call's result for a child resting at ``view``, with the child's usage.

    Raises:
        NotPerformed: the child has not ended (it waits on a person, a timer, a budget, a
            write to reconcile); nothing of the parent's call is recorded.
    """
    result = run_result(view.state, view.detail)
    if result is None:
        raise NotPerformed(
            f"the child run {view.run_id} is {view.state.value}; this call completes once it "
            "ends (its parent is driven again then)"
        )
    if view.state is not RunState.COMPLETED:
        # The parent's model reads this as its call's answer: say which child ended how.
        result["summary"] = f"the child run {view.run_id} {view.state.value}: {result['summary']}"
    usage = view.usage()
    result["usage"] = {**usage, "steps": view.step_count}
    return result


class RunFlows(FlowCatalog):
    """The ``FlowHost`` every drive of a Runtime is given: it reads and starts child runs over
    ``definitions`` and ``reads``, and drives them with ``drive`` (the Runtime's, so a child is
    refused, failed or answered as any run it drives)."""

    def __init__(
        self,
        definitions: Definitions,
        reads: RunReads,
        *,
        credentials: Credentials,
        drive: Callable[..., Awaitable[RunView]],
        attachable: frozenset[str] = frozenset(),
        attachable_mcp: Mapping[str, McpServerSpec] | None = None,
    ) -> None:
        super().__init__(definitions, credentials=credentials)
        self.reads = reads
        self._drive = drive
        # What an agent may attach to its run tree (``--attachable-tools``: registry tools, and
        # ``mcp:<name>`` for a server of ``--attachable-mcp``, whose declarations are these).
        self.attachable = attachable
        self.attachable_mcp = attachable_mcp or {}
        self._client_saves = ClientSaves(definitions, credentials=credentials)

    async def save_agent(self, session: FlowSession, content: str) -> dict:
        """An agent file written in a linked run, saved on the client (``ClientSaves``)."""
        return await self._client_saves.save_agent(session, content)

    async def save_graph(
        self, session: FlowSession, namespace: str, name: str, content: str
    ) -> dict:
        """A flow written in a linked run, saved on the client (``ClientSaves``)."""
        return await self._client_saves.save_graph(session, namespace, name, content)

    def registry_tool(self, name: str) -> Tool | None:
        return self.definitions.registry.get(name)

    async def attach_tools(self, session: FlowSession, names: Sequence[str]) -> dict:
        """An agent's ``attach_tool`` (``agent_attach``, against ``--attachable-tools``)."""
        registry: ToolRegistry = self.definitions.registry
        return agent_attach(registry, self.attachable_mcp, self.attachable, names)

    async def run_child(
        self, parent: FlowSession, seq: int, agent: str, task: str, inputs: Mapping[str, str]
    ) -> dict:
        """Start (once) and drive the child of the subagent call at ``seq`` of ``parent``.

        A child that exists already is continued under the agent its head records, whatever
        the catalog's name means now.

        Raises:
            ToolFailed: no registered agent answers to ``agent`` (retryable=False; the message
                names the known ones); nothing was started.
            NotPerformed: the child rests short of an end, or its drive stopped (a model call
                that may pass, another writer); the parent's call stays open.
            StoreUnavailable: the store failed under the child (``store_fault``); nothing of
                the parent's call is recorded, and its drive stops on the fault as its own.
        """
        child = child_run_id(parent.run_id, seq)
        view = await self.reads.find_view(child)
        if view is None:
            found = await self.catalog_agent(agent)
            labels = {PARENT_LABEL: parent.run_id}
            held = {AUTONOMOUS_LABEL: "true"} if parent.autonomous else {}
            if parent.linked:
                held[LINKED_LABEL] = parent.client_project
            labels.update(inherited_labels(held, parent.attached))
            head = RunStarted(
                agent_def_hash=found.agent_def_hash,
                input={"task": task, "inputs": dict(inputs)},
                labels=labels,
            )
            with contextlib.suppress(SeqConflict):  # another drive of this call started it
                await self.access.append(child, [head], EMPTY_VIEW)
            view = await self.reads.view(child)
        try:
            definition = await self.definitions.load_agent(view.agent_def_hash)
            view = await self._drive(child, agent=definition)
        except OperationRefused as exc:
            raise ToolFailed(
                f"the child run {child} cannot be driven here: {exc.message}", retryable=False
            ) from None
        except CodedError as exc:
            if store_fault(exc):
                # The store failed under the child: it is the tree's fault, healed from the
                # root (the parent's drive stops on it, and re-driving the parent drives the
                # child on), never this call's answer.
                raise
            raise NotPerformed(
                f"the drive of the child run {child} stopped ({exc.message}); this call is "
                "asked again when the parent is driven again"
            ) from None
        return child_result(view)

    async def catalog_agent(self, agent: str) -> StoredAgent:
        """The registered agent ``agent`` names: a hash, or a name (its newest registration).

        Raises:
            ToolFailed: none does (retryable=False), naming the known names and the nearest.
        """
        if agent.startswith(HASH_PREFIX):
            stored = await self.definitions.find_agent(agent)
            if stored is not None:
                return stored
        registered = await self.definitions.list_agents()
        named = [stored for stored in registered if stored.name == agent]
        if named:
            return named[-1]  # oldest first: the last is the newest registration
        names = sorted({stored.name for stored in registered if stored.name})
        message = f"no registered agent is named {agent!r}"
        message += f"; the known ones: {', '.join(names)}" if names else "; none is registered"
        nearest = difflib.get_close_matches(agent, names, n=1)
        if nearest:
            message += f" (did you mean {nearest[0]!r}?)"
        raise ToolFailed(message, retryable=False)
