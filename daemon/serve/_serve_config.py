"""What ``salvor serve`` is configured with: one frozen value, every field defaulted.

The command line (``cli._serve_command``) builds it from the flags; an embedding host (the tests)
builds it directly, so the checks that hold for every way in live here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from salvor.store import RunQuota

from ..agents import Credentials
from ..client_runs import DEFAULT_TTL_SECONDS
from ..cluster import DEFAULT_FENCE_MARGIN_SECONDS, DEFAULT_LEASE_SECONDS
from ..mcp import McpServerSpec
from ..notify import NotifyConfig
from ..recording import DEFAULT_MIN_FREE_BYTES
from ..runs import BUFFER_BYTES, MAX_STREAMS_PER_CLIENT
from ..tools import Workspace
from ..web import BODY_TIMEOUT_SECONDS, FAILED_TRIES, MIN_TOKEN_BYTES
from ._worker_role import WorkerRole


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
    # how often it (and a graph run's ndjson stream) sends a keep-alive
    # (--stream-keepalive), and how long
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
    # The folder built-in agents' file tools are confined to, and whether `bash` is offered
    # (--workspace, --allow-bash, --bash-timeout); None: no file tools.
    workspace: Workspace | None = None
    # The operator's skill directories (--skills-dir), searched in order before salvor's own.
    skills_dirs: tuple[str, ...] = ()
    # The registry tools an agent in edit mode may attach to its run tree (--attachable-tools).
    attachable_tools: frozenset[str] = frozenset()
    # The MCP servers that may be attached to a run by name (--attachable-mcp), by name.
    attachable_mcp: Mapping[str, McpServerSpec] = field(default_factory=dict)
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
