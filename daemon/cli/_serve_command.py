"""`salvor serve` on the command line: its flags, the daemon's settings they make, the refusals
made before anything is opened (a short token, a listener others could drive), and the run.

Every refusal here is one sentence (``CliError``; ``UsageError`` exits 2) and opens nothing.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import json
import logging
import os
import sys

import trio
from salvor.store import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RUN_BYTES,
    DEFAULT_MAX_RUN_EVENTS,
    RunQuota,
)

from ..agents import CredentialError, Credentials
from ..client_runs import load_declarations
from ..cluster import DEFAULT_FENCE_MARGIN_SECONDS, DEFAULT_LEASE_SECONDS
from ..metrics import JsonLines
from ..recording import DEFAULT_MIN_FREE_BYTES
from ..runs import BUFFER_BYTES, MAX_STREAMS_PER_CLIENT
from ._arguments import (
    AUTO_WORKERS,
    MAX_WORKERS,
    allowed_host,
    allowed_origin,
    cores,
    event_count,
    listen_address,
    port_number,
    positive_seconds,
    size_in_bytes,
    stream_buffer_bytes,
    streams_per_client,
    token_tries,
    trusted_proxy,
    wake_interval,
    worker_count,
)
from ._errors import CliError, UsageError


def add_serve_parser(sub, common: argparse.ArgumentParser) -> None:
    """`salvor serve` and its options."""
    p = sub.add_parser(
        "serve",
        parents=[common],
        help="run the daemon: the HTTP control plane, drivers, wake sweeper",
        description="Runs until SIGTERM or SIGINT. With --json it prints one line on stdout "
        'once it listens, {"listening": [URL, ...], "pid": N} (with --workers, also "workers": '
        "[PID, ...], once every worker serves), and logs JSON lines on stderr.",
    )
    _add_listen_options(p)
    _add_agent_options(p)
    _add_worker_options(p)
    _add_declaration_options(p)
    _add_stream_options(p)
    _add_browser_options(p)
    _add_notify_options(p)
    _add_hardening_options(p)
    _add_quota_options(p)
    _add_node_options(p)


def _add_listen_options(p: argparse.ArgumentParser) -> None:
    """Where the daemon listens, who may call it, how it logs, how often it wakes sleepers."""
    p.add_argument(
        "--listen",
        metavar="HOST:PORT|unix:PATH",
        type=listen_address,
        default="127.0.0.1:8420",
        help="where to listen (default 127.0.0.1:8420), or a Unix socket only your user can "
        "open (mode 0600; no token needed); an address other machines reach needs --auth-token",
    )
    p.add_argument(
        "--auth-token",
        metavar="ENV_VAR",
        help="name of the environment variable holding the bearer token",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="the daemon's log on stderr: text lines (the default), or one JSON object per line "
        "(time, level, logger, message, run when the record concerns one, error); --json "
        "makes it json, and also prints one JSON object on stdout once the daemon listens "
        '({"listening": [URL, ...], "pid": N})',
    )
    p.add_argument(
        "--wake-interval",
        type=wake_interval,
        default=60.0,
        metavar="SECONDS",
        help="how often the wake sweeper runs (default 60; 0 turns it off)",
    )


def _add_agent_options(p: argparse.ArgumentParser) -> None:
    """What the daemon's runs may use: the demo tools, local agents, client tools, the proxy."""
    p.add_argument(
        "--demo-tools",
        action="store_true",
        help="register the demo tools (lookup_invoice, issue_refund, send_email, ...)",
    )
    p.add_argument(
        "--allow-process-agents",
        action="store_true",
        help="accept process agents (commands this daemon runs) and service agents (a loopback "
        "port it binds, a URL it POSTs to) through POST /v1/agents, and run stored ones; on TCP "
        "it needs --auth-token (or use --listen unix:PATH)",
    )
    p.add_argument(
        "--client-tool",
        action="append",
        default=[],
        metavar="FILE",
        help="declare a tool clients perform themselves (TOML or JSON; repeatable)",
    )
    p.add_argument(
        "--proxy-port",
        type=port_number,
        default=0,
        metavar="PORT",
        help="the loopback port process agents' model calls go through (default: a free one)",
    )


# -- one machine, every core (issue 30, item 4) --
# One process per core: each worker is a node whose runs the store fences from its siblings'.
DEFAULT_WORKERS = AUTO_WORKERS


def _add_worker_options(p: argparse.ArgumentParser) -> None:
    """How many processes serve: one interpreter uses one core."""
    p.add_argument(
        "--workers",
        type=worker_count,
        default=DEFAULT_WORKERS,
        metavar="N|auto",
        help="serve with N daemon processes on the one --listen address, under a supervisor "
        "that restarts one that dies (default auto: one per core this process may use, and one "
        "over a store only one process can open; 1: a single process, no supervisor)",
    )


def _add_declaration_options(p: argparse.ArgumentParser) -> None:
    """What definitions may reach: the model endpoints, MCP origins and service origins the
    operator declared, each with the variables bound to it (the trust rule's one source)."""
    p.add_argument(
        "--model-endpoint",
        action="append",
        default=[],
        metavar="URL[,key_env=VAR|,key_file=PATH]",
        help=(
            "a model endpoint agents registered over HTTP may name, and "
            "the one key it gets (repeatable)"
        ),
    )
    p.add_argument(
        "--mcp-origin",
        action="append",
        default=[],
        metavar="ORIGIN[,header_env=VAR]",
        help="an MCP origin agents registered over HTTP may reach, and the variables its headers "
        "may name (repeatable)",
    )
    # Issue 29 item 3 (secrets): a service agent's trigger is held to the same rule.
    p.add_argument(
        "--service-origin",
        action="append",
        default=[],
        metavar="ORIGIN[,header_env=VAR]",
        help="an origin a service agent's trigger `url` may be on, and the variables its "
        "`headers` may name (repeatable)",
    )


def _add_stream_options(p: argparse.ArgumentParser) -> None:
    """What a reader of the live streams may make the daemon hold (issue 29)."""
    p.add_argument(
        "--stream-buffer-bytes",
        type=stream_buffer_bytes,
        default=BUFFER_BYTES,
        metavar="BYTES",
        help="what one event stream or WebSocket may hold queued and unsent (default 1048576); "
        "a WebSocket past it is closed 1013, a stream reads what it missed back from the store",
    )
    p.add_argument(
        "--max-streams-per-client",
        type=streams_per_client,
        default=MAX_STREAMS_PER_CLIENT,
        metavar="N",
        help="open event streams and WebSockets per client address, past which a new one is "
        f"refused 429 (default {MAX_STREAMS_PER_CLIENT}; 0: no cap)",
    )


def _add_browser_options(p: argparse.ArgumentParser) -> None:
    """Who besides the loopback names and the daemon's own pages may call it (issue 29)."""
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        type=allowed_host,
        metavar="NAME",
        help="a host name (or address) requests may name in their Host besides localhost and "
        "the loopback addresses, with any port: a reverse proxy's public name (repeatable)",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        type=allowed_origin,
        metavar="ORIGIN",
        help="an origin (scheme://host[:port]) whose pages may call the API besides the daemon's "
        "own (repeatable)",
    )


def _add_hardening_options(p: argparse.ArgumentParser) -> None:
    """`salvor serve`'s flags of issue 29's smaller holes: proxy in front, wrong tokens, HTTP/2."""
    from ..web import FAILED_TRIES, WINDOW_SECONDS

    p.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        type=trusted_proxy,
        metavar="ADDRESS",
        help="a TLS-terminating proxy (an address or network) whose X-Forwarded-Proto and "
        "X-Forwarded-For are believed: https there makes the session cookie Secure (repeatable; "
        "default: none, the headers are ignored)",
    )
    p.add_argument(
        "--token-tries",
        type=token_tries,
        default=FAILED_TRIES,
        metavar="N",
        help=f"wrong tokens (login or bearer) a client may give within {WINDOW_SECONDS:g} s "
        f"before its tries are refused 429 until then (default {FAILED_TRIES}; 0: no limit)",
    )
    p.add_argument(
        "--http2",
        action="store_true",
        help="also speak cleartext HTTP/2 (prior knowledge, h2c) on the API listener; off by "
        "default (an HTTP/2 client can flood a server with stream resets)",
    )


def _add_quota_options(p: argparse.ArgumentParser) -> None:
    """`salvor serve`'s quotas (issue 29, item 5): what one caller can make the daemon store."""
    p.add_argument(
        "--max-run-events",
        type=event_count("--max-run-events"),
        default=DEFAULT_MAX_RUN_EVENTS,
        metavar="N",
        help=f"events one run's log may hold (default {DEFAULT_MAX_RUN_EVENTS}); a run that "
        "reaches it fails, naming it",
    )
    p.add_argument(
        "--max-run-bytes",
        type=size_in_bytes("--max-run-bytes"),
        default=DEFAULT_MAX_RUN_BYTES,
        metavar="BYTES",
        help="bytes of event payloads one run's log may hold (default 64MiB); a run that "
        "reaches it fails, naming it",
    )
    p.add_argument(
        "--max-payload-bytes",
        type=size_in_bytes("--max-payload-bytes"),
        default=DEFAULT_MAX_PAYLOAD_BYTES,
        metavar="BYTES",
        help="the largest request body the API reads and the largest event payload a run may "
        "record (default 8MiB)",
    )
    p.add_argument(
        "--min-free-bytes",
        type=size_in_bytes("--min-free-bytes", zero="off"),
        default=DEFAULT_MIN_FREE_BYTES,
        metavar="BYTES",
        help="free space a SQLite store's filesystem must keep for new runs, forks and "
        "registrations to be accepted (default 1GiB; 0 turns it off); running runs go on",
    )


def _add_node_options(p: argparse.ArgumentParser) -> None:
    """`salvor serve`'s node flags (issue 30, run ownership): several daemons over one store."""
    p.add_argument(
        "--node-name",
        metavar="NAME",
        help="this daemon's name among the nodes serving its store (default: the host name); "
        "its node id adds the pid and a random suffix",
    )
    p.add_argument(
        "--lease-seconds",
        type=positive_seconds("--lease-seconds"),
        default=DEFAULT_LEASE_SECONDS,
        metavar="SECONDS",
        help=f"how long this node's lease lasts without a renewal (default "
        f"{DEFAULT_LEASE_SECONDS:g}; renewed every sixth of it): a dead node's runs are taken "
        "over by a live one after it",
    )
    p.add_argument(
        "--fence-margin-seconds",
        type=positive_seconds("--fence-margin-seconds", zero=True),
        default=DEFAULT_FENCE_MARGIN_SECONDS,
        metavar="SECONDS",
        help=f"how long before its lease could lapse a node that could not renew it stops "
        f"starting effects (default {DEFAULT_FENCE_MARGIN_SECONDS:g}; below --lease-seconds)",
    )


def _add_notify_options(p: argparse.ArgumentParser) -> None:
    """`salvor serve`'s notification flags (the command line is the only place they are set)."""
    p.add_argument(
        "--notify-webhook",
        metavar="URL",
        help="POST a JSON notification here when a run starts waiting on a person or fails",
    )
    p.add_argument(
        "--notify-command",
        metavar="CMD",
        help="run this command line (split as a shell would, run without one) with each "
        "notification on its stdin",
    )
    p.add_argument(
        "--notify-secret-env",
        metavar="ENV_VAR",
        help="name of the environment variable whose value signs each webhook body "
        "(X-Salvor-Signature)",
    )


def serve_config(args: argparse.Namespace, url: str):
    """The daemon's settings from ``salvor serve``'s flags, the environment and the files they
    name (the client tools, the credentials).

    Raises:
        UsageError: a flag's value, or a pair of them, the daemon cannot take.
        CliError: what a flag names is missing or unreadable.
    """
    from ..serve import ServeConfig

    if not args.fence_margin_seconds < args.lease_seconds:
        raise UsageError(
            f"--fence-margin-seconds {args.fence_margin_seconds:g} must be shorter than "
            f"--lease-seconds {args.lease_seconds:g}"
        )
    listen = args.listen
    token = _auth_token(args.auth_token)
    return ServeConfig(
        **_named_settings(args),
        **(
            {"unix_socket": listen.unix_socket}
            if listen.unix_socket
            else {"host": listen.host, "port": listen.port}
        ),
        store_url=url,
        auth_token=token,
        wake_interval=args.wake_interval,
        demo_tools=args.demo_tools,
        proxy_port=args.proxy_port,
        allow_process_agents=args.allow_process_agents,
        # Streaming bounds (issue 29).
        stream_buffer_bytes=args.stream_buffer_bytes,
        max_streams_per_client=args.max_streams_per_client,
        trusted_proxies=tuple(args.trusted_proxy),
        token_tries=args.token_tries,
        http2=args.http2,
        quota=RunQuota(
            max_run_events=args.max_run_events,
            max_run_bytes=args.max_run_bytes,
            max_payload_bytes=args.max_payload_bytes,
        ),
        min_free_bytes=args.min_free_bytes,
        # Browsers (issue 29, item 1).
        allow_hosts=tuple(args.allow_host),
        allow_origins=tuple(args.allow_origin),
        # Run ownership (issue 30).
        node_name=args.node_name,
        lease_seconds=args.lease_seconds,
        fence_margin_seconds=args.fence_margin_seconds,
    )


def _auth_token(variable: str | None) -> str | None:
    """The bearer token in the environment variable ``--auth-token`` names (None: no token).

    Raises:
        CliError: the variable is not set.
        UsageError: its token is too short to be safe.
    """
    from ..web import MIN_TOKEN_BYTES

    if not variable:
        return None
    token = os.environ.get(variable)
    if not token:
        raise CliError(f"--auth-token names {variable}, but that environment variable is not set")
    if len(token.encode("utf-8", "surrogateescape")) < MIN_TOKEN_BYTES:
        # A short token can be guessed, however slowly wrong tries are answered. The token
        # itself is never quoted: this sentence goes to a terminal and to logs.
        raise UsageError(
            f"--auth-token names {variable}, whose token is shorter than "
            f"{MIN_TOKEN_BYTES} bytes; make a good one with: python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'"
        )
    return token


def _named_settings(args: argparse.Namespace) -> dict:
    """The settings read from what the flags and the environment name: the client-run lease's
    length, the client tools' files, the credentials, the notification target and this process's
    role under ``--workers``.

    Raises:
        CliError: a file or variable named is missing or malformed.
        UsageError: the notification flags or the worker variables do not fit together.
    """
    from ..client_runs import lease_ttl
    from ..notify import NotifyConfig
    from ..serve import WorkerRole

    try:
        ttl = lease_ttl()
        client_tools = load_declarations(args.client_tool)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        credentials = Credentials.for_daemon(
            args.model_endpoint, args.mcp_origin, args.service_origin
        )
    except CredentialError as exc:
        raise CliError(str(exc)) from None
    try:
        notify = NotifyConfig.from_flags(
            args.notify_webhook, args.notify_command, args.notify_secret_env
        )
        worker = WorkerRole.from_environment(os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return {
        "lease_ttl": ttl,
        "client_tools": client_tools,
        "credentials": credentials,
        "notify": notify,
        "worker": worker,
    }


async def serve_main(args: argparse.Namespace, url: str) -> int:
    """``salvor serve``: the daemon, until SIGTERM or SIGINT; with ``--json`` one line on stdout
    once it listens."""
    from ..serve import serve, settle_collector

    config = serve_config(args, url)
    if config.unix_socket is None:
        _refuse_tcp_exposure(config, await _check_resolves(config.host, config.port))
    worker = None if config.worker is None else config.worker.index
    log_to_stderr("json" if args.json else args.log_format, worker=worker)
    workers = 1 if config.worker is not None else worker_processes(args.workers, url)
    if workers > 1:
        return await _supervise(args, config, workers)
    settle_collector()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, config))
        # A worker's supervisor prints the service's line.
        if args.json and config.worker is None:
            print(json.dumps({"listening": binds, "pid": os.getpid()}), flush=True)
    return 0


def worker_processes(asked: int | str, url: str) -> int:
    """How many processes serve ``url`` for ``--workers asked``: ``auto`` is one per core, or
    one (said in the log) over a store several processes cannot share.

    Raises:
        UsageError: a count above one over such a store; nothing was opened.
    """
    from ..serve import unshared_store

    unshared = unshared_store(url)
    if asked == AUTO_WORKERS:
        if unshared is None:
            return min(cores(), MAX_WORKERS)
        logging.getLogger("salvor.workers").info(
            "--workers auto: one process serves, because %s", unshared
        )
        return 1
    if asked > 1 and unshared is not None:
        raise UsageError(
            f"--workers {asked} needs a store every worker process opens, but {unshared}; give "
            "--store a file path or a PostgreSQL URL, or serve with --workers 1"
        )
    return asked


async def _supervise(args: argparse.Namespace, config, workers: int) -> int:
    """``salvor serve --workers N``: the supervisor of N workers (``serve._workers``)."""
    from ..serve import CrashLoop, supervise

    def ready(binds: list[str], pids: list[int]) -> None:
        if args.json:
            print(json.dumps({"listening": binds, "pid": os.getpid(), "workers": pids}), flush=True)

    try:
        # The words as given (``_main`` keeps them); the process's own when called some other way.
        argv = getattr(args, "argv", None) or sys.argv[1:]
        await supervise(config, argv, workers, on_ready=ready)
    except CrashLoop as exc:
        raise CliError(str(exc)) from None
    return 0


def log_to_stderr(log_format: str, *, worker: int | None = None) -> None:
    """The daemon's log on stderr, as text lines or as JSON lines (``--log-format``); a worker of
    ``--workers N`` names itself on each line."""
    handler = logging.StreamHandler()
    tag = "" if worker is None else f" worker={worker}"
    handler.setFormatter(
        JsonLines(worker=worker)
        if log_format == "json"
        else logging.Formatter(f"%(asctime)s %(name)s{tag} %(levelname)s %(message)s")
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    # httpx tells every request it sends at INFO: a line per model call (and per MCP or service
    # call), each with its full URL, was most of what a busy daemon logged and about 3% of its
    # CPU. Its warnings still show; salvor logs what a call meant to a run itself.
    logging.getLogger("httpx").setLevel(logging.WARNING)


async def _check_resolves(host: str, port: int) -> list[str]:
    """The addresses a --listen host names; refused when it names none, before anything is
    opened."""
    try:
        found = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    except OSError as exc:
        raise CliError(
            f"--listen host {host[:80]!r} does not resolve to an address ({exc.strerror or exc})"
        ) from None
    return [str(sockaddr[0]) for *_, sockaddr in found]


# -- other local users (issue 29, item 2) --
_TOKEN_WAYS = (
    "put a token in an environment variable and name it with --auth-token ENV_VAR, or listen "
    "on a Unix socket only your user can open with --listen unix:PATH"
)


def _refuse_tcp_exposure(config, addresses: list[str]) -> None:
    """Refuse a TCP listener without a token where others could drive the daemon: one that may
    start programs (anyone on the machine could make it run one as this user), or one reachable
    from other machines. Loopback without process agents stays open (the first command of the
    README).

    Raises:
        UsageError: the flags make such a listener; nothing was opened.
    """
    if config.auth_token is not None:
        return
    if config.allow_process_agents:
        raise UsageError(
            f"--allow-process-agents lets whoever reaches {config.listen} run programs as your "
            f"user, so on TCP it needs a token: {_TOKEN_WAYS}"
        )
    if not all(_loopback(address) for address in addresses):
        raise UsageError(
            f"--listen {config.listen} is reachable from other machines, so it needs a token: "
            f"{_TOKEN_WAYS}, or on a loopback address such as 127.0.0.1"
        )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False
