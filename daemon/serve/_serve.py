"""``salvor serve``: the daemon's root nursery and the services in it.

Lifetimes, outermost first: the store lock (``_store_owner``: taken before
anything else, so a daemon beside a command-line driver touches nothing), the
store (its writer thread), then one nursery
holding the change feed (what other processes commit to the store, told to
the event hub), the HTTP server, the drivers' nursery, the wake sweeper, the
signal watcher, the watchdog and, when the operator named a target, the
notification deliverer. Each service reports started only once it is bound
or loaded; systemd hears READY=1 after all of them. Recovery comes after
READY: the interrupted runs go to the driving set, which paces them (so many
drive at once, so few start processes at once) while the server answers.
Store faults heal in the drivers' nursery too (``_store_healing``).

Graceful stop (SIGTERM, SIGINT): stop accepting, cancel drivers with a
reason and wait for them within ``drain_seconds`` (past it the runs still
held are named in the log and their unconfirmed appends abandoned), end
streams within ``shutdown_seconds``, exit 0. A run cut mid-effect keeps its
open intent, the legal crash state; the next start recovers it.

A worker of ``salvor serve --workers N`` (``config.worker``, started by ``_workers``) lives the
same way, except: no store lock (its supervisor holds it), the supervisor's socket instead of a
bind of its own, READY and WATCHDOG to the supervisor, and a stop also when the supervisor is
gone. Its duties are a whole node's: what it recovers, wakes and delivers it claims in the store.

Beside this module: its configuration (``_serve_config``), where it listens (``_listening``), the
routes' shared state (``_server_state``), the sleeping runs it wakes (``_run_sweeps``) and how it
hears a stop (``_stop_signals``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from ..agents import Credentials
from ..api import ServerState
from ..client_runs import open_model_executor
from ..cluster import (
    NodeIdentity,
    NodeLease,
    Peers,
    StoreDriving,
    Takeover,
    keep_lease,
)
from ..metrics import DaemonMetrics, counting_into, stop_counting
from ..notify import Deliverer, NotifyConfig
from ..processes import sweep_orphans
from ..proxies import ModelProxy
from ..recording import open_store_access
from ..runs import (
    SERVE,
    Batching,
    DriverSet,
    EventHub,
    Runtime,
    change_feed,
    own_store,
)
from ..skills import SkillLibrary
from ..tools import ToolRegistry, demo_registry
from ._listening import InFlight, listen_api, model_proxy
from ._notify import Notifier
from ._run_sweeps import sweep_forever
from ._serve_config import ServeConfig
from ._server_state import server_state
from ._stop_signals import HeldSignals, watch_lifeline, watch_signals

log = logging.getLogger("salvor.serve")


async def _watchdog(notifier: Notifier) -> None:
    while True:
        notifier.send("WATCHDOG=1")
        await trio.sleep(notifier.watchdog_interval)


async def serve(
    config: ServeConfig,
    *,
    registry: ToolRegistry | None = None,
    stop: trio.Event | None = None,
    on_state: Callable[[ServerState], None] | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGTERM/SIGINT (or ``stop`` is set).
    Reports started with the bound URLs.

    ``registry`` is the embedding host's tools; None gives ``salvor serve``'s (the demo
    tools with ``config.demo_tools``, else an empty registry); ``config.workspace`` and
    ``config.skills_dirs`` (when given) are given to it either way (its file tools, its skills).
    A host that wires no registry at all passes ``ToolRegistry.unwired()``: its tool steps and
    graph tool nodes are refused as unavailable (503) instead of unknown (404).

    ``stop`` and ``on_state`` are for embedding (tests): setting ``stop``
    begins the same graceful stop a signal does, and ``on_state`` is handed
    the routes' shared state once it exists.
    """
    registry = registry or (
        demo_registry(store_url=config.store_url) if config.demo_tools else ToolRegistry()
    )
    if config.workspace is not None:
        registry.workspace = config.workspace
    if config.skills_dirs:
        registry.skills = SkillLibrary(config.skills_dirs)
    # This daemon's own instruments, made current before any task starts so that every task
    # (the proxy's handlers, the drives, the MCP sessions they open) counts into them.
    if config.worker is not None:
        HeldSignals.hold()
    metrics = DaemonMetrics(worker=None if config.worker is None else config.worker.index)
    counting = counting_into(metrics)
    try:
        await _serve(config, registry, metrics, stop, on_state, task_status)
    finally:
        stop_counting(counting)


@dataclass(frozen=True, slots=True)
class _Opened:
    """What a daemon holds open for its whole life, outermost first."""

    locks: object
    access: object
    proxy: ModelProxy
    executor: object


@asynccontextmanager
async def _open(config: ServeConfig, metrics: DaemonMetrics) -> AsyncIterator[_Opened]:
    """The store lock, the store, the model proxy and the model executor, for the block.

    Raises:
        StoreOwned: another live salvor holds the store; nothing was opened.
        OperationRefused: listen_failed, the model proxy's port cannot be bound.
    """
    async with (
        # First of all: while another live salvor serves this store (or a
        # command line drives its runs), this one touches nothing.
        # A worker's supervisor holds the lock for the whole service (None: take none).
        own_store(config.store_url, SERVE, share=None if config.worker else False) as locks,
        open_store_access(
            config.store_url,
            notifications=config.notify is not None,
            commit_observer=metrics.observe_commit,
            quota=config.quota,
        ) as access,
        model_proxy(config.proxy_port, metrics) as proxy,
        open_model_executor() as executor,
    ):
        yield _Opened(locks, access, proxy, executor)


@dataclass(frozen=True, slots=True)
class _Node:
    """This daemon as a node over its store: who it is, its lease, and the runtime it drives
    runs with (its appends fenced by the lease)."""

    identity: NodeIdentity
    lease: NodeLease
    peers: Peers
    credentials: Credentials
    runtime: Runtime

    @property
    def owners(self):
        return self.runtime.access.store.owners


async def _become_node(
    config: ServeConfig, opened: _Opened, registry: ToolRegistry, metrics: DaemonMetrics
) -> _Node:
    """Sweep the agents an earlier daemon left, read the credentials, and make this daemon a node
    whose appends the store fences (nothing is driven yet)."""
    access, proxy = opened.access, opened.proxy
    # Before anything can drive a run: the agents an earlier daemon over
    # this store left running when it was killed would otherwise run on
    # beside the copies recovery starts.
    await sweep_orphans(access.store.url)
    credentials = config.credentials or await trio.to_thread.run_sync(Credentials.for_daemon)
    proxy.upstream_key = credentials.upstream_key
    identity = NodeIdentity.here(config.node_name)
    lease = NodeLease(config.lease_seconds, config.fence_margin_seconds)
    peers = Peers()
    access.driving = StoreDriving(
        access.store.owners,
        identity,
        lease,
        dead_nodes=lambda: peers.dead,
        metrics=metrics,
        writer=access,
    )
    # -- many machines (issue 30, item 5): each scrape says which node answered --
    metrics.read_node(access.driving.reading)
    runtime = Runtime(
        access,
        registry,
        proxy=proxy,
        process_restarts=config.process_restarts,
        credentials=credentials,
        allow_process_agents=config.allow_process_agents,
        attachable_tools=config.attachable_tools,
        attachable_mcp=config.attachable_mcp,
    )
    return _Node(identity, lease, peers, credentials, runtime)


async def _serve(
    config: ServeConfig,
    registry: ToolRegistry,
    metrics: DaemonMetrics,
    stop: trio.Event | None,
    on_state: Callable[[ServerState], None] | None,
    task_status,
) -> None:
    notifier = Notifier()
    stop = stop if stop is not None else trio.Event()
    async with _open(config, metrics) as opened:
        node = await _become_node(config, opened, registry, metrics)
        async with trio.open_nursery() as root:
            # The node's row and lease before anything is driven; retired when root ends.
            await root.start(
                keep_lease,
                node.owners,
                node.identity,
                node.lease,
                opened.access.driving,
                node.peers,
            )
            async with trio.open_nursery() as drivers_nursery:
                state = await _start_state(config, opened, node, drivers_nursery, root, metrics)
                if on_state is not None:
                    on_state(state)
                binds, in_flight = await _start_listening(root, config, opened, node, state, stop)
                takeover = _takeover(opened, node, state.drivers)
                # Start-up recovery is the takeover's first sweep: the runs of this node's
                # previous life (a dead node now) and of any other node gone.
                interrupted = await takeover.find(first=True)
                _start_keepers(root, config, state, notifier)
                state.drivers.spawn(takeover.forever, name="takeover sweep")
                _log_serving(config, node, binds, opened.proxy, len(interrupted))
                # READY before any run is driven again: recovery is paced behind
                # it by the driving set's bounds and the server answers meanwhile.
                notifier.send("READY=1")
                task_status.started(binds)
                takeover.take(interrupted)
                await stop.wait()
                await _stop_driving(state, config, notifier)
            await node.runtime.aclose()
            # Responses in flight finish first (a stream sends its end frame
            # and closes cleanly), within the deadline. Idle keep-alive
            # connections are not waited for: they carry nothing.
            with trio.move_on_after(config.shutdown_seconds):
                await in_flight.wait_idle()
            root.cancel_scope.cancel(reason="salvor stopped")


async def _start_state(
    config: ServeConfig,
    opened: _Opened,
    node: _Node,
    drivers_nursery: trio.Nursery,
    root: trio.Nursery,
    metrics: DaemonMetrics,
) -> ServerState:
    """The driving set in ``drivers_nursery``, the event hub fed by this process's commits and
    (in ``root``) by the change feed, and the routes' shared state over them."""
    access = opened.access
    drivers = DriverSet(
        node.runtime,
        drivers_nursery,
        concurrency=config.recovery_concurrency,
        launches=config.process_launches,
        launch_settle_seconds=config.launch_settle_seconds,
    )
    # A burst of a run's commits goes out as one write per stream (``Batching``).
    hub = EventHub(Batching(driven_here=drivers.driving))
    access.on_commit.append(hub.publish)
    # -- streams carry every run, whoever commits it (issue 30, item 2) --
    await root.start(change_feed(access, drivers.driving, metrics).serve, hub)
    return await server_state(
        config,
        node.runtime,
        drivers,
        hub,
        opened.executor,
        node.credentials,
        opened.locks,
        metrics,
    )


async def _start_listening(
    root: trio.Nursery,
    config: ServeConfig,
    opened: _Opened,
    node: _Node,
    state: ServerState,
    stop: trio.Event,
) -> tuple[list[str], InFlight]:
    """Serve HTTP, say where (the store's lock, this node's row), start the deliverer and the
    signal watcher: the addresses bound and the in-flight counter.

    Raises:
        OperationRefused: listen_failed, the address could not be bound (nothing was served).
    """
    binds, in_flight = await listen_api(root, config, state, stop)
    worker = config.worker
    if worker is None:
        await trio.to_thread.run_sync(opened.locks.announce, binds[0])
    else:
        root.start_soon(watch_lifeline, worker.lifeline_fd, stop)
    await trio.to_thread.run_sync(node.owners.set_listen, node.identity.node_id, binds[0])
    if config.notify is not None:
        # Before recovery drives anything: a run that parks again gets its poke.
        await _start_deliverer(root, config.notify, opened.access, state)
    root.start_soon(watch_signals, stop, worker is not None)
    return binds, in_flight


def _takeover(opened: _Opened, node: _Node, drivers: DriverSet) -> Takeover:
    """This node's sweep for the runs of dead nodes (its own previous life included)."""
    access, reads = opened.access, node.runtime.reads
    return Takeover(
        node.owners,
        node.lease,
        access.driving,
        dead_nodes=lambda: node.peers.dead,
        candidates=reads.recovery_candidates,
        walked_out=reads.without_walked_children,
        held_elsewhere=opened.locks.runs_held_elsewhere,
        start=drivers.start,
        before_first_of=lambda: sweep_orphans(access.store.url),
    )


def _log_serving(
    config: ServeConfig, node: _Node, binds: list[str], proxy: ModelProxy, interrupted: int
) -> None:
    worker = config.worker
    log.info(
        "salvor %s on %s as node %s, model proxy on %s (%d interrupted runs to recover)",
        "serving" if worker is None else f"worker {worker.index} serving",
        ", ".join(binds),
        node.identity.node_id,
        proxy.url,
        interrupted,
    )


def _start_keepers(
    root: trio.Nursery, config: ServeConfig, state: ServerState, notifier: Notifier
) -> None:
    """The tasks that keep a serving daemon well: the fan-out's delivery, the wake sweeper, the
    watchdog and store healing (this one in the drivers' nursery: nothing is re-driven once a
    stop began)."""
    root.start_soon(state.hub.deliver_forever)
    if config.wake_interval > 0:
        root.start_soon(sweep_forever, state, config.wake_interval)
    if notifier.watchdog_interval:
        root.start_soon(_watchdog, notifier)
    drivers, access = state.drivers, state.runtime.access
    drivers.spawn(
        lambda: drivers.healing.heal_forever(access.check_writable, drivers.start),
        name="store healing",
    )


async def _stop_driving(state: ServerState, config: ServeConfig, notifier: Notifier) -> None:
    """Tell systemd and the open streams that the daemon stops, then stop the drivers within
    the drain deadline (a run still held past it keeps its log and resumes next start)."""
    notifier.send("STOPPING=1")
    state.stopping.set()
    await state.drivers.stop(
        "salvor is stopping; each run keeps its log and resumes on the next start",
        drain_seconds=config.drain_seconds,
    )


async def _start_deliverer(
    root: trio.Nursery, notify: NotifyConfig, access, state: ServerState
) -> None:
    """Start delivering the outbox in ``root``; each append that writes a row pokes it."""
    # Its claims on outbox rows name this node; in flight means attached on any node (a peer's
    # drive, or a client's lease taken through any node).
    node = state.this_node() if state.this_node is not None else None
    deliverer = Deliverer(access, notify, in_flight=state.attached_anywhere, node=node)
    access.on_notification.append(deliverer.poke)
    await root.start(deliverer.serve)
