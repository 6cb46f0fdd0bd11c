"""What every route shares: the services (runs, client-driven runs), the driving set, the fan-out,
and the daemon's settings for them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio
from salvor.protocol import TERMINAL_STATES

from ..agents import Credentials
from ..client_runs import ClientRuns, ClientTool, DriveLeases, LeaseRegistry
from ..metrics import DaemonMetrics
from ..models import ModelGateway
from ..recording import FreeSpaceFloor
from ..runs import BUFFER_BYTES, DriverSet, EventHub, Runtime
from ..web import BODY_TIMEOUT_SECONDS, MAX_BODY_BYTES, FailedTries, Logins, Sessions, wrong_state
from ._stream_slots import StreamSlots

_TERMINAL = {state.value for state in TERMINAL_STATES}


async def refuse_if_driven_elsewhere(state: ServerState, run_id: str) -> None:
    """Refuse (409 wrong_state, nothing recorded) to drive a run a live
    `salvor run` beside us drives."""
    if state.driven_elsewhere is None:
        return
    if run_id in await trio.to_thread.run_sync(state.driven_elsewhere, [run_id]):
        raise wrong_state(
            f"run {run_id} is being driven by another salvor process beside this daemon "
            "(a `salvor run`); let it finish, or stop it first, then resume it here"
        )


@dataclass
class ServerState:
    """What the routes share: one runtime, one driving set, one fan-out."""

    runtime: Runtime
    drivers: DriverSet
    hub: EventHub
    auth_token: str | None = None
    # The page's login sessions (only used with an auth token). Issue 30: salvor serve keeps them
    # in the store (any node answers a cookie any node gave); in memory by default here.
    sessions: Logins = field(default_factory=Sessions)
    # Issue 29, the token's rate limit: each client's recent wrong tokens (login and bearer).
    failed_tries: FailedTries = field(default_factory=FailedTries)
    commit: str | None = None
    stream_poll_seconds: float = 1.0
    heartbeat_seconds: float = 15.0
    detach_grace_seconds: float = 5.0
    # -- streaming bounds (issue 29, item 4 and item 6's WebSocket bullet) --
    # What one SSE stream or /v1/ws connection may hold queued and unsent, in bytes: a WebSocket
    # past it is closed (1013), a stream reads what overflowed back from the store.
    stream_buffer_bytes: int = BUFFER_BYTES
    # Open SSE streams and WebSockets per client (peer address), capped (--max-streams-per-client).
    stream_slots: StreamSlots = field(default_factory=StreamSlots)
    # How long any request body may take to arrive whole before it is answered 408.
    body_timeout_seconds: float = BODY_TIMEOUT_SECONDS
    # Whether POST /v1/agents accepts process agents (commands this daemon runs).
    allow_process_agents: bool = False
    # The model endpoints and MCP origins the operator declared: all a
    # definition from HTTP may name.
    credentials: Credentials = field(default_factory=Credentials)
    # Set when the daemon begins a graceful stop: open streams end at once.
    stopping: trio.Event = field(default_factory=trio.Event)
    # Drive-token holds on client-driven runs. Issue 30: salvor serve keeps them in the store (a
    # client may drive through any node); in memory by default here.
    leases: DriveLeases = field(default_factory=LeaseRegistry)
    # The model client that performs client-driven runs' model steps (None: not configured).
    model_executor: ModelGateway | None = None
    # Client-performed tools the operator declared (salvor serve --client-tool), by name.
    client_tools: dict[str, ClientTool] = field(default_factory=dict)
    # Which of the given runs another live salvor (a `salvor run` beside this
    # daemon) is driving right now; None when nothing else can drive here.
    # A blocking call (it asks the store's locks): run it in a thread.
    driven_elsewhere: Callable[[list[str]], set[str]] | None = None
    # This daemon's Prometheus registry and instruments (GET /metrics renders it).
    metrics: DaemonMetrics = field(default_factory=DaemonMetrics)
    # Quotas (issue 29, item 5): the largest body a route reads (--max-payload-bytes), and the
    # free-space floor new work is refused under (None: no floor).
    max_payload_bytes: int = MAX_BODY_BYTES
    floor: FreeSpaceFloor | None = None
    # -- one machine, every core (issue 30, item 4) --
    # Which worker of ``salvor serve --workers N`` this is (``/v1/health`` says it); None: a
    # daemon of its own.
    worker: int | None = None
    # Run ownership (issue 30): this node's id now, and the store's owners of the given runs (a
    # blocking read, ``RunOwners.owners``: run it in a thread); None: one process, no owners.
    this_node: Callable[[], str] | None = None
    owners_of: Callable[[list[str]], Mapping[str, Any]] | None = None
    # The operations on client-driven runs (shared by their routes and the ASGI front).
    client_runs: ClientRuns = field(init=False)

    def __post_init__(self) -> None:
        self.client_runs = self.runtime.client_runs(
            leases=self.leases,
            client_tools=self.client_tools,
            model_executor=self.model_executor,
            floor=self.floor,
        )

    async def attached(self, run_id: str, owner: Any = None) -> bool:
        """Whether something drives the run right now: a driver task here, a live node's drive
        (``owner``, the run's ``RunOwner`` when read), or a client's current lease (taken
        through any node).

        Raises:
            StoreUnavailable: the leases could not be read.
        """
        if self.drivers.driving(run_id) or _node_driving(owner) is not None:
            return True
        return await self.leases.holds(run_id)

    async def attached_anywhere(self, run_id: str) -> bool:
        """``attached``, asking the store whether a peer node drives the run (one read).

        Raises:
            StoreUnavailable: the store could not be read.
        """
        if self.drivers.driving(run_id):
            return True
        return await self.attached(run_id, (await self.run_owners([run_id])).get(run_id))

    async def run_owners(self, run_ids: list[str]) -> Mapping[str, Any]:
        """The store's owner of each of ``run_ids`` (one read); empty without an owners table.

        Raises:
            StoreUnavailable: the store could not be read.
        """
        if self.owners_of is None or not run_ids:
            return {}
        return await trio.to_thread.run_sync(self.owners_of, run_ids)

    async def driver(self, run_id: str, state: str | None) -> dict:
        """The ``driver`` field, and ``driver_node`` when a node drives the run: absent for a
        terminal or unreadable run."""
        return (await self.driver_fields([(run_id, state)]))[run_id]

    async def driver_fields(self, runs: Iterable[tuple[str, str | None]]) -> dict[str, dict]:
        """``driver`` (and ``driver_node``) for a page of ``(run id, state)``: one read of the
        owners and one of the leases for the page."""
        runs = list(runs)
        live = [run_id for run_id, state in runs if state is not None and state not in _TERMINAL]
        owners = await self.run_owners([r for r in live if not self.drivers.driving(r)])
        unowned = [
            r for r in live if not self.drivers.driving(r) and _node_driving(owners.get(r)) is None
        ]
        held = await self.leases.holding(unowned)
        fields: dict[str, dict] = {run_id: {} for run_id, _ in runs}
        for run_id in live:
            owner = owners.get(run_id)
            attached = (
                self.drivers.driving(run_id) or _node_driving(owner) is not None or run_id in held
            )
            fields[run_id] = self._driver_field(run_id, attached, owner)
        return fields

    def driver_seen(self, run_id: str, state: str | None) -> dict:
        """``driver`` for a caller that cannot wait for the store (a live connection's run row,
        made as a commit is published): a driver task here, or a lease this process saw stand
        lately (``DriveLeases.seen_holding``)."""
        if state is None or state in _TERMINAL:
            return {}
        attached = self.drivers.driving(run_id) or self.leases.seen_holding(run_id)
        return self._driver_field(run_id, attached, None)

    def _driver_field(self, run_id: str, attached: bool, owner: Any) -> dict:
        node = _node_driving(owner)
        if node is None and self.drivers.driving(run_id) and self.this_node is not None:
            node = self.this_node()
        fields = {"driver": "attached" if attached else "none"}
        if node is not None:
            fields["driver_node"] = node
        return fields


def _node_driving(owner: Any) -> str | None:
    """The node whose drive holds the run, by its owner row (a live node, driving it)."""
    if owner is None or owner.node_id is None or not owner.driving or not owner.node_live:
        return None
    return owner.node_id
