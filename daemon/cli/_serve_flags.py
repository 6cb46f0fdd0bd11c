"""`salvor serve`'s flags, grouped by what they set: each checked as it is parsed (``_arguments``),
each with a default, so a daemon started with none serves safely on loopback."""

from __future__ import annotations

import argparse

from salvor.store import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RUN_BYTES,
    DEFAULT_MAX_RUN_EVENTS,
)

from ..cluster import DEFAULT_FENCE_MARGIN_SECONDS, DEFAULT_LEASE_SECONDS
from ..recording import DEFAULT_MIN_FREE_BYTES
from ..runs import BUFFER_BYTES, MAX_STREAMS_PER_CLIENT
from ..tools import SHELL_TIMEOUT_SECONDS
from ._arguments import (
    AUTO_WORKERS,
    allowed_host,
    allowed_origin,
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
        "--workspace",
        metavar="DIR",
        help="the folder built-in agents' file tools (read, ls, find, grep, write, edit) may "
        "touch, within each agent's `access` globs (default: none, and no file tools)",
    )
    p.add_argument(
        "--allow-bash",
        action="store_true",
        help="offer the `bash` tool too: shell commands run in the workspace as your user; needs "
        "--workspace, and on TCP --auth-token (or use --listen unix:PATH)",
    )
    p.add_argument(
        "--bash-timeout",
        type=positive_seconds("--bash-timeout"),
        default=SHELL_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help=f"the longest one `bash` command runs (default {SHELL_TIMEOUT_SECONDS:g})",
    )
    p.add_argument(
        "--skills-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of skills (each a folder holding SKILL.md) agents may declare; repeatable "
        "or comma-separated, searched in order before the skills salvor ships (default: those "
        "alone)",
    )
    p.add_argument(
        "--attachable-tools",
        default="",
        metavar="NAMES",
        help="registry tools (comma-separated) an agent in edit mode may attach to its own run "
        "tree with attach_tool, an attachable MCP server written mcp:NAME (default: none; the "
        "operator's POST /v1/runs/{id}/tools needs no such list)",
    )
    p.add_argument(
        "--attachable-mcp",
        default=None,
        metavar="FILE",
        help="a TOML file of [[mcp_servers]] (as an agent definition writes them) that may be "
        "attached to a run by name at run time (default: none)",
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
        "--stream-keepalive",
        type=positive_seconds("--stream-keepalive"),
        default=15.0,
        metavar="SECONDS",
        help="how long a quiet event stream or graph-run stream waits before it sends a "
        "keep-alive (default 15); keep it well under the read timeout of any proxy in front",
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
