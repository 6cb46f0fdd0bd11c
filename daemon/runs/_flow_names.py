"""Flows kept by name, as the daemon reaches them: naming a stored graph ``namespace/name`` (a new
version when the graph differs from the current one's), finding a name's current graph, listing
the names and a name's versions.

What writes a name: ``flow_write`` (the writing run recorded as its author) and
``POST /v1/graphs?name=`` (no run). What reads one: ``POST /v1/graph-runs`` with ``flow_name``,
``salvor graph run NS/NAME``, ``GET /v1/flows`` and the page. A run started by name is started on
the graph its name had then: its head records that hash, so a later version never changes it.
"""

from __future__ import annotations

from salvor.protocol import BadFlowName, ErrorCode, excerpt, split_flow_name
from salvor.store import FlowVersion, NamedFlow, Naming

from ..recording import StoreAccess
from ..web import OperationRefused, bad_request


def unknown_flow(flow_name: str) -> OperationRefused:
    return OperationRefused(
        ErrorCode.UNKNOWN_FLOW,
        f"no flow is kept here as {excerpt(flow_name)!r}; `flow_write` or "
        "POST /v1/graphs?name=NAMESPACE/NAME names one (GET /v1/flows lists them)",
        details={"flow": flow_name},
    )


def flow_name_parts(flow_name: str) -> tuple[str, str]:
    """``(namespace, name)`` of a caller's ``namespace/name``.

    Raises:
        OperationRefused: bad_request saying what is wrong with it.
    """
    try:
        return split_flow_name(flow_name)
    except BadFlowName as exc:
        raise bad_request(str(exc)) from None


class FlowNames:
    """The named flows of one store (``store.named_flows``), read and written off the trio
    thread."""

    def __init__(self, access: StoreAccess) -> None:
        self.access = access

    async def name(
        self, namespace: str, name: str, graph_hash: str, *, run_id: str | None
    ) -> Naming:
        """Set ``namespace/name`` to the stored graph ``graph_hash`` (a new version unless its
        current version already has that graph); ``run_id`` is the run that wrote it (None: a
        caller of the API).

        Raises:
            StoreUnavailable: the database failed; no version was written (the graph stays
                stored, unnamed by this call).
        """
        named = self.access.store.named_flows.name
        return await self.access.read(named, namespace, name, graph_hash, run_id=run_id)

    async def current(self, flow_name: str) -> tuple[str, str, FlowVersion]:
        """``(namespace, name, current version)`` of the flow ``flow_name`` names.

        Raises:
            OperationRefused: bad_request (not a flow name), unknown_flow (no flow kept so).
        """
        namespace, name = flow_name_parts(flow_name)
        found = await self.access.read(self.access.store.named_flows.current, namespace, name)
        if found is None:
            raise unknown_flow(flow_name)
        return namespace, name, found

    async def versions(self, namespace: str, name: str) -> list[FlowVersion]:
        """Every version of ``namespace/name``, oldest first.

        Raises:
            OperationRefused: unknown_flow (no flow kept so; a bad name is kept by none).
        """
        found = await self.access.read(self.access.store.named_flows.versions, namespace, name)
        if not found:
            raise unknown_flow(f"{namespace}/{name}")
        return found

    async def list(self) -> list[NamedFlow]:
        """Every named flow at its current version, by namespace and name."""
        return await self.access.read(self.access.store.named_flows.list)
