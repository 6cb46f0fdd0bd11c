"""`salvor serve` on the command line: the daemon's settings its flags make (the flags themselves
are ``_serve_flags``), the refusals made before anything is opened (a short token, a listener
others could drive), and the run.

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
    RunQuota,
)

from ..agents import CredentialError, Credentials
from ..client_runs import load_declarations
from ..metrics import JsonLines
from ._arguments import (
    AUTO_WORKERS,
    MAX_WORKERS,
    cores,
)
from ._attachable import read_attachable
from ._errors import CliError, UsageError


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
    named = _named_settings(args)
    return ServeConfig(
        **named,
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
        workspace=_workspace(args),
        skills_dirs=skills_dirs(args.skills_dir),
        attachable_tools=_names(args.attachable_tools),
        attachable_mcp=_attachable_mcp(args, named["credentials"]),
        # Streaming bounds (issue 29).
        stream_buffer_bytes=args.stream_buffer_bytes,
        heartbeat_seconds=args.stream_keepalive,
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


def _workspace(args: argparse.Namespace):
    """The file tools' workspace from --workspace, --allow-bash and --bash-timeout (None: none).

    Raises:
        UsageError: --allow-bash without --workspace.
        CliError: the folder is not there.
    """
    from ..tools import Workspace

    if args.workspace is None:
        if args.allow_bash:
            raise UsageError("--allow-bash needs --workspace DIR: the folder its commands run in")
        return None
    root = os.path.realpath(args.workspace)
    if not os.path.isdir(root):
        raise CliError(f"--workspace names {args.workspace}, which is not a folder")
    return Workspace(root=root, shell=args.allow_bash, shell_timeout=args.bash_timeout)


def skills_dirs(given: list[str]) -> tuple[str, ...]:
    """The folders ``--skills-dir`` names (repeated or comma-separated), each resolved.

    Raises:
        CliError: one is not a folder.
    """
    found = []
    for part in (part.strip() for value in given for part in value.split(",")):
        if not part:
            continue
        root = os.path.realpath(part)
        if not os.path.isdir(root):
            raise CliError(f"--skills-dir names {part}, which is not a folder")
        found.append(root)
    return tuple(dict.fromkeys(found))


def _attachable_mcp(args: argparse.Namespace, credentials: Credentials) -> dict:
    """The MCP servers --attachable-mcp declares, by name (none without it).

    Raises:
        UsageError: the file cannot be used (``AttachableError``'s sentence).
    """
    if args.attachable_mcp is None:
        return {}
    return read_attachable(args.attachable_mcp, credentials, args.allow_process_agents)


def _names(text: str) -> frozenset[str]:
    """A comma-separated flag's names (blanks dropped)."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


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
    if config.workspace is not None and config.workspace.shell:
        raise UsageError(
            f"--allow-bash lets whoever reaches {config.listen} run shell commands as your "
            f"user (through an agent's bash tool), so on TCP it needs a token: {_TOKEN_WAYS}"
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
