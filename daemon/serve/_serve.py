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
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio
from salvor.protocol import CodedError, ErrorCode
from salvor.store import RunQuota

from ..agents import Credentials
from ..api import AppendFront, ServerState, StreamSlots, create_app, refuse_if_driven_elsewhere
from ..client_runs import DEFAULT_TTL_SECONDS, StoredLeases, open_model_executor
from ..cluster import (
    DEFAULT_FENCE_MARGIN_SECONDS,
    DEFAULT_LEASE_SECONDS,
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
from ..proxies import ModelProxy, open_model_proxy
from ..recording import DEFAULT_MIN_FREE_BYTES, FreeSpaceFloor, open_store_access
from ..runs import (
    BUFFER_BYTES,
    MAX_STREAMS_PER_CLIENT,
    SERVE,
    Batching,
    DriverSet,
    EventHub,
    ResumeOutcome,
    Runtime,
    change_feed,
    own_store,
)
from ..tools import ToolRegistry, demo_registry
from ..web import (
    BODY_TIMEOUT_SECONDS,
    FAILED_TRIES,
    MIN_TOKEN_BYTES,
    Browsers,
    FailedTries,
    OperationRefused,
    StoredSessions,
    TrustedProxies,
    UnixSocketRefused,
    claim_unix_socket,
    inherited_bind,
    listener_config,
)
from ..web import serve as serve_asgi
from ._notify import Notifier
from ._worker_role import WorkerRole

log = logging.getLogger("salvor.serve")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8420
    store_url: str
    auth_token: str | None = None
    wake_interval: float = 60.0
    demo_tools: bool = False
    shutdown_seconds: float = 10.0
    # How long a stop waits for the cancelled drivers to end (``DriverSet.stop``,
    # whose own default, ``DRAIN_SECONDS``, is the same).
    drain_seconds: float = 10.0
    recovery_concurrency: int = 64
    # How many drives may be starting local processes (agents, stdio MCP
    # servers) at once, and how long each start holds its slot at most:
    # an interpreter starting takes a core for a while.
    process_launches: int = 2
    launch_settle_seconds: float = 1.0
    # Event streams: how often a quiet stream looks up from its wait (what other
    # processes commit reaches it through the change feed, whenever it comes),
    # how often it sends a keep-alive comment, and how long
    # a run nothing here drives may stay quiet before its stream ends detached.
    stream_poll_seconds: float = 1.0
    heartbeat_seconds: float = 15.0
    detach_grace_seconds: float = 5.0
    body_timeout_seconds: float = BODY_TIMEOUT_SECONDS
    # The loopback model proxy process agents call through (127.0.0.1 only;
    # 0 picks a free port).
    proxy_port: int = 0
    # Process agents registered over HTTP run commands here: the operator opts in.
    allow_process_agents: bool = False
    # How long a client-driven run's drive token holds without a driving call.
    lease_ttl: float = DEFAULT_TTL_SECONDS
    # Client-performed tool declarations (--client-tool), by name.
    client_tools: dict = field(default_factory=dict)
    # How often a drive restarts a process agent a signal killed before it
    # leaves the run for a resume.
    process_restarts: int = 3
    # The operator's model endpoints, MCP origins and key files
    # (--model-endpoint, --mcp-origin); None: only the implicit ones.
    credentials: Credentials | None = None
    # Where the operator is told of runs that wait on a person or fail (--notify-*); None: no
    # outbox rows are written at all.
    notify: NotifyConfig | None = None
    # -- other local users (issue 29, item 2) --
    # ``--listen unix:PATH``: serve on this Unix socket (mode 0600) instead of host:port.
    unix_socket: str | None = None

    @property
    def listen(self) -> str:
        """Where the API listens, as ``--listen`` spells it."""
        return f"unix:{self.unix_socket}" if self.unix_socket else f"{self.host}:{self.port}"

    # Streaming bounds (issue 29): what one stream or WebSocket may hold unsent, in bytes, and how
    # many of them one client (peer address) may hold open (0: no cap).
    stream_buffer_bytes: int = BUFFER_BYTES
    max_streams_per_client: int = MAX_STREAMS_PER_CLIENT
    # How long a WebSocket on which nothing arrives (no message, no pong) stays open; None: the
    # listener's default (60 s). The server pings at a third of it at most.
    ws_idle_seconds: float | None = None
    # Issue 29, the smaller holes: the TLS-terminating proxies whose X-Forwarded-Proto and
    # X-Forwarded-For are believed (--trusted-proxy; none by default), and whether the API
    # listener speaks cleartext HTTP/2 (--http2; off, against rapid-reset floods).
    trusted_proxies: tuple[str, ...] = ()
    http2: bool = False
    # Wrong tokens a client may give per window before its tries are refused (--token-tries; 0:
    # no limit).
    token_tries: int = FAILED_TRIES

    # Quotas (issue 29, item 5): what one run may make the store keep (--max-run-events,
    # --max-run-bytes, --max-payload-bytes), and the free space a SQLite store's filesystem
    # keeps for new work (--min-free-bytes; 0: no floor).
    quota: RunQuota = field(default_factory=RunQuota)
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES

    # Browsers (issue 29, item 1): names a request's Host may give besides the loopback ones and
    # the --listen host (--allow-host), and origins whose pages may call the API besides the
    # daemon's own (--allow-origin); the agents' ports admit loopback names only.
    allow_hosts: tuple[str, ...] = ()
    allow_origins: tuple[str, ...] = ()

    # -- one machine, every core (issue 30, item 4) --
    # Set in a worker of ``salvor serve --workers N`` (``_worker_role``): it serves the socket its
    # supervisor bound and takes no store lock (the supervisor holds it). None: a daemon of its
    # own.
    worker: WorkerRole | None = None
    # Run ownership (issue 30): this node's name among the daemons serving its store (None: the
    # host name), how long its lease lasts unrenewed, and how long before that it stops starting
    # effects when it could not renew.
    node_name: str | None = None
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    fence_margin_seconds: float = DEFAULT_FENCE_MARGIN_SECONDS

    def __post_init__(self) -> None:
        # The command line refuses a short token in its own words first; this holds for every
        # other way in.
        if (
            self.auth_token is not None
            and len(self.auth_token.encode("utf-8", "surrogateescape")) < MIN_TOKEN_BYTES
        ):
            raise ValueError(f"the auth token must be at least {MIN_TOKEN_BYTES} bytes")


# Bound on the git commands of ``build_commit``, together: a hung git (a
# locked index, a network filesystem) delays the start by this much at most.
GIT_SECONDS = 5.0


async def build_commit() -> str | None:
    """The short git hash of the checkout this code runs from (``-dirty`` with local changes).

    None when it is not a checkout, git is missing or fails, or git takes
    longer than ``GIT_SECONDS``. git runs as a child process trio waits on,
    never on the trio thread.
    """
    root = Path(__file__).resolve().parents[2]
    if not await trio.Path(root / ".git").exists():
        return None

    async def git(*args: str) -> str | None:
        try:
            done = await trio.run_process(
                ["git", "-C", str(root), *args],
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        except OSError:
            return None
        return done.stdout.decode(errors="replace").strip() if done.returncode == 0 else None

    with trio.move_on_after(GIT_SECONDS):
        head = await git("rev-parse", "--short", "HEAD")
        dirty = await git("status", "--porcelain", "--untracked-files=no")
        if head and dirty is not None:
            return f"{head}-dirty" if dirty else head
    return None


async def interrupted_runs(
    state: ServerState, driven_elsewhere: Callable[[list[str]], set[str]] | None = None
) -> list[str]:
    """The server-driven runs the log says were interrupted (one index read, nothing per run).

    ``driven_elsewhere`` names, in one call, the runs another live salvor (a
    ``salvor run``) drives right now: they are not interrupted, so they are
    left out.

    Raises:
        StoreUnavailable: the store cannot be read.
    """
    runtime = state.runtime
    interrupted = await runtime.reads.interrupted_runs()
    if driven_elsewhere is None:
        return interrupted
    skip = await trio.to_thread.run_sync(driven_elsewhere, interrupted)
    return [run_id for run_id in interrupted if run_id not in skip]


def recover(state: ServerState, run_ids: list[str]) -> int:
    """Hand every interrupted run to the driving set; returns how many drivers were started.

    Nothing is read here, and nothing waits: each driver loads its run's
    view and agent itself, inside the driving set's bounds (how many drive
    at once, how many start processes at once), so the server answers while
    recovery goes on. A run whose agent this store does not hold (or that no
    longer builds) is logged by its driver and left as it is.
    """
    return sum(state.drivers.start(run_id, recovery=True) for run_id in run_ids)


async def sweep_once(state: ServerState) -> int:
    """Re-drive every sleeping run whose instant has passed, through the resume path."""
    woken = 0
    for run_id in await state.runtime.reads.due_runs():
        if state.drivers.driving(run_id):
            continue
        try:
            await refuse_if_driven_elsewhere(state, run_id)
            decision = await state.runtime.control.resume(run_id)
        except CodedError as exc:
            # One bad run does not stop the sweep; it stays due.
            log.warning("sleeping run %s not woken: %s", run_id, exc.message, extra={"run": run_id})
            continue
        if decision.outcome is ResumeOutcome.DRIVING:
            woken += state.drivers.start(run_id)
    return woken


async def _sweep_forever(state: ServerState, interval: float) -> None:
    while True:
        await sweep_once(state)
        # Uploads no call named in time go too: one conditional delete on the store's clock, so
        # whichever node sweeps first removes them and the others find nothing left.
        await state.runtime.uploads.sweep()
        await trio.sleep(interval)


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
    tools with ``config.demo_tools``, else an empty registry). A host that wires no
    registry at all passes ``ToolRegistry.unwired()``: its tool steps and graph tool nodes
    are refused as unavailable (503) instead of unknown (404).

    ``stop`` and ``on_state`` are for embedding (tests): setting ``stop``
    begins the same graceful stop a signal does, and ``on_state`` is handed
    the routes' shared state once it exists.
    """
    registry = registry or (
        demo_registry(store_url=config.store_url) if config.demo_tools else ToolRegistry()
    )
    # This daemon's own instruments, made current before any task starts so that every task
    # (the proxy's handlers, the drives, the MCP sessions they open) counts into them.
    if config.worker is not None:
        _HeldSignals.hold()
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
        _model_proxy(config.proxy_port, metrics) as proxy,
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
    return await _server_state(
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
    binds, in_flight = await _listen(root, config, state, stop)
    worker = config.worker
    if worker is None:
        await trio.to_thread.run_sync(opened.locks.announce, binds[0])
    else:
        root.start_soon(_watch_lifeline, worker.lifeline_fd, stop)
    await trio.to_thread.run_sync(node.owners.set_listen, node.identity.node_id, binds[0])
    if config.notify is not None:
        # Before recovery drives anything: a run that parks again gets its poke.
        await _start_deliverer(root, config.notify, opened.access, state)
    root.start_soon(_watch_signals, stop, worker is not None)
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
        root.start_soon(_sweep_forever, state, config.wake_interval)
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


async def _server_state(
    config: ServeConfig,
    runtime: Runtime,
    drivers: DriverSet,
    hub: EventHub,
    executor,
    credentials: Credentials,
    locks,
    metrics: DaemonMetrics,
) -> ServerState:
    """What every route shares, from the daemon's configuration and its services."""
    return ServerState(
        runtime=runtime,
        drivers=drivers,
        hub=hub,
        auth_token=config.auth_token,
        failed_tries=FailedTries(limit=config.token_tries),
        commit=await build_commit(),
        stream_poll_seconds=config.stream_poll_seconds,
        heartbeat_seconds=config.heartbeat_seconds,
        detach_grace_seconds=config.detach_grace_seconds,
        body_timeout_seconds=config.body_timeout_seconds,
        allow_process_agents=config.allow_process_agents,
        # Issue 30, item 3: leases and login sessions live in the store, so a client or a person
        # may reach any node over it.
        leases=StoredLeases(runtime.access, config.lease_ttl),
        sessions=StoredSessions(runtime.access.store.sessions),
        model_executor=executor,
        client_tools=dict(config.client_tools),
        credentials=credentials,
        driven_elsewhere=locks.runs_held_elsewhere,
        metrics=metrics,
        worker=None if config.worker is None else config.worker.index,
        # Streaming bounds (issue 29).
        stream_buffer_bytes=config.stream_buffer_bytes,
        stream_slots=StreamSlots(config.max_streams_per_client),
        max_payload_bytes=config.quota.max_payload_bytes,
        floor=FreeSpaceFloor(config.store_url, config.min_free_bytes),
        # Run ownership (issue 30): ``driver_node`` and a peer's drives read from the store.
        this_node=lambda: runtime.access.driving.node.node_id,
        owners_of=runtime.access.store.owners.owners,
    )


async def _listen(
    root: trio.Nursery, config: ServeConfig, state: ServerState, stop: trio.Event
) -> tuple[list[str], InFlight]:
    """Start the HTTP server in ``root``; the addresses it bound and its in-flight counter.

    Raises:
        OperationRefused: listen_failed, the address could not be bound (nothing was served).
    """
    bind, unix_socket = await _bind_spec(config)
    hyper = _listener_config(config, bind)
    in_flight = InFlight(
        TrustedProxies(AppendFront(create_app(state), state), config.trusted_proxies)
    )

    browsers = Browsers.of(config.allow_hosts, config.allow_origins, listen=config.host)

    async def serve_http(task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            await serve_asgi(
                in_flight,
                hyper,
                browsers=browsers,
                shutdown_trigger=stop.wait,
                # A worker takes its share of the connections (``_connection_share``).
                tally=None if config.worker is None else config.worker.connection_tally(),
                task_status=task_status,
            )
        finally:
            if unix_socket is not None:
                # A clean stop leaves no socket file behind (a kill leaves one the next start
                # finds stale and removes).
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(unix_socket.release)

    try:
        binds = await root.start(serve_http)
    except (OSError, BaseExceptionGroup) as exc:
        failed = _bind_failure(exc)
        if failed is None:
            raise
        raise OperationRefused(
            ErrorCode.LISTEN_FAILED,
            f"cannot listen on {config.listen} ({failed.strerror or failed}); "
            "stop what holds it, or pick another address with --listen",
        ) from None
    return binds, in_flight


async def _bind_spec(config: ServeConfig):
    """What the listener binds (hypercorn's spelling), and the Unix socket claimed for it, if
    any (released when serving ends).

    Raises:
        OperationRefused: listen_failed, a worker's inherited descriptor is no listening socket,
            or the Unix socket cannot be claimed.
    """
    if config.worker is not None:
        # The supervisor bound the address (and owns a Unix socket's file): serve its socket.
        try:
            return inherited_bind(config.worker.listen_fd), None
        except ValueError as exc:
            raise OperationRefused(ErrorCode.LISTEN_FAILED, str(exc)) from None
    if config.unix_socket is not None:
        try:
            unix_socket = await trio.to_thread.run_sync(claim_unix_socket, config.unix_socket)
        except UnixSocketRefused as exc:
            raise OperationRefused(ErrorCode.LISTEN_FAILED, str(exc)) from None
        return unix_socket.bind_spec(), unix_socket
    return f"{config.host}:{config.port}", None


def _listener_config(config: ServeConfig, bind: str):
    """hypercorn's settings for the API listener on ``bind``."""
    hyper = listener_config(bind, "salvor.http", graceful_timeout=config.shutdown_seconds)
    if config.ws_idle_seconds is not None:
        hyper.websocket_idle_timeout = config.ws_idle_seconds
        hyper.websocket_ping_interval = min(
            hyper.websocket_ping_interval, config.ws_idle_seconds / 3
        )
    hyper.http2 = config.http2
    return hyper


@asynccontextmanager
async def _model_proxy(port: int, metrics: DaemonMetrics) -> AsyncIterator[ModelProxy]:
    """The loopback model proxy on ``port`` (0: a free one), for the block.

    Raises:
        OperationRefused: listen_failed, the port could not be bound (nothing was served); a
            failure inside the block leaves as itself.
    """
    entered = False
    try:
        async with open_model_proxy(port, metrics=metrics) as proxy:
            entered = True
            yield proxy
    except (OSError, BaseExceptionGroup) as exc:
        failed = None if entered else _bind_failure(exc)
        if failed is None:
            raise
        raise OperationRefused(
            ErrorCode.LISTEN_FAILED,
            f"the model proxy cannot listen on 127.0.0.1:{port} ({failed.strerror or failed}); "
            "stop what holds that port, or give salvor serve another --proxy-port (0 picks a "
            "free one)",
        ) from None


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


def _bind_failure(exc: BaseException) -> OSError | None:
    """The OSError a failed bind raised, out of the nurseries it came
    through; None for anything else."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None


class InFlight:
    """ASGI wrapper counting HTTP requests and WebSockets in progress, so a stop can wait for them
    alone."""

    def __init__(self, app) -> None:
        self._app = app
        self._count = 0
        self._idle = trio.Event()
        self._idle.set()

    async def __call__(self, scope, receive, send) -> None:
        # A WebSocket counts too: it closes (1001) as the stop begins, and its close frame must
        # go out before the listener is torn down.
        if scope["type"] not in ("http", "websocket"):
            await self._app(scope, receive, send)
            return
        if self._count == 0:
            self._idle = trio.Event()
        self._count += 1
        try:
            await self._app(scope, receive, send)
        finally:
            self._count -= 1
            if self._count == 0:
                self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


class _HeldSignals:
    """A worker's SIGTERM and SIGINT outside the signal watcher: noted, never fatal.

    A worker may hear one stop twice (systemd signals every process of the unit, a terminal its
    whole process group, and the supervisor forwards its own): the second, arriving after the
    watcher let go of the signals, would otherwise kill the process as it exits. One that
    arrives before the watcher runs is noted, and the watcher stops at once.
    """

    received = False

    @classmethod
    def hold(cls) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, cls._note)

    @classmethod
    def _note(cls, signum, frame) -> None:
        cls.received = True


async def _watch_signals(stop: trio.Event, keep_receiving: bool = False) -> None:
    """Set ``stop`` at the first SIGTERM or SIGINT. ``keep_receiving`` (a worker): hold the
    signals until the end, so a second copy of the stop does not cut it half-way."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        if keep_receiving and _HeldSignals.received:
            stop.set()
        async for _ in signals:
            stop.set()
            if not keep_receiving:
                return


async def _watch_lifeline(fd: int, stop: trio.Event) -> None:
    """Set ``stop`` once the supervisor's end of the worker's lifeline closes: the supervisor is
    gone (SIGKILL included), and a worker never serves on without it."""
    try:
        while True:
            await trio.lowlevel.wait_readable(fd)
            if not os.read(fd, 512):
                log.warning("the supervisor of this worker is gone; stopping")
                stop.set()
                return
    finally:
        os.close(fd)
