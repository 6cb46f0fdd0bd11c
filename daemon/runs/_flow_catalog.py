"""The flow host's read and authoring side: ``flow_results``, the agent catalog, and registering
agents and graphs written by an agent (``flow_agents``, ``flow_write``), over a Runtime.

PLACEHOLDER: the ``flowread`` branch replaces this module. Until then each method refuses the
call as a tool error (retrying cannot help), and edit mode stays off, its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..flows import FlowSession
from ..tools import ToolFailed

if TYPE_CHECKING:
    from ._runtime import Runtime


class FlowCatalog:
    """What the flow tools read of a store's runs and agents, and what they register in it."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def edit_mode(self) -> bool:
        """Whether the operator has authoring on (off: no setting is stored yet)."""
        return False

    async def flow_results(self, session: FlowSession, args: Mapping[str, Any]) -> Any:
        raise ToolFailed("flow_results is not built yet", retryable=False)

    async def agent_catalog(self) -> list[dict]:
        raise ToolFailed("the agent catalog is not built yet", retryable=False)

    async def write_agent(self, content: str) -> dict:
        raise ToolFailed("writing agents is not built yet", retryable=False)

    async def write_graph(self, namespace: str, name: str, content: str) -> dict:
        raise ToolFailed("writing graphs is not built yet", retryable=False)
