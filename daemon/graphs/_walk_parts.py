"""What the node kinds walked outside ``_walk`` (a nested flow, a pinned agent, a live snapshot)
use of the walk that calls them.

``GraphWalk`` has these parts; it imports the modules that walk those nodes, so they name the
walk by the parts they use, and the modules import one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from salvor.protocol import GraphNode

from ..agents import AgentDefinition, DriveKit
from ..recording import RunContext, StoreAccess
from ..tools import ToolRegistry
from ._flow_check import FlowFiles


class WalkParts(Protocol):
    """One drive's walk of one graph run (a ``GraphWalk``), as its node helpers see it."""

    kit: DriveKit
    # A flow run's files, None for a graph by hash.
    files: FlowFiles | None
    access: StoreAccess
    agents: Mapping[str, AgentDefinition]
    registry: ToolRegistry
    # The run's head labels (None until the head is read).
    labels: dict[str, str] | None

    @property
    def run_id(self) -> str: ...

    def tree_labels(self, ctx: RunContext) -> dict[str, str] | None: ...

    async def fail(self, ctx: RunContext, node: GraphNode, message: str) -> None:
        """Fail the run naming ``node``; raises Parked (or takes the recorded RunFailed)."""
