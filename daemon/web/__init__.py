"""HTTP plumbing: the listener (and the Unix socket it may serve on, or a socket a supervisor bound
for its workers) and what a browser may ask of it (Host, Origin, a JSON body's type), ASGI
helpers, the one body reader, strict JSON bodies, the error envelope and its refusals (their next
steps in an HTTP caller's words), request values, outbound TLS, the caller check (bearer token or
the page's session cookie), the sessions behind it, the count of wrong tokens per client, what a
trusted proxy forwards, and the threads that parse and check what a caller sent (``off_loop``).
``ErrorCode`` (code -> status, defined in ``salvor.protocol``) is re-exported here for the HTTP
layer.

Rule: knows HTTP, not runs. Imports nothing else from the daemon, and no web framework (Quart is
the HTTP API's, so a CLI run never loads it).
"""

from __future__ import annotations

import typing

import trio

from ._asgi import (
    answer_lifespan,
)
from ._browsers import (
    JSON_PORTS,
    Browsers,
    canonical_host,
    canonical_origin,
    guarded,
    is_json_media,
    json_media_type,
    media_type,
    unsupported_media_type,
)
from ._callers import (
    CSRF_HEADER,
    Caller,
    admit,
    peer_of,
)
from ._connection_share import ConnectionTally  # issue 30: the workers share out connections
from ._errors import (
    OperationRefused,
    bad_request,
    internal,
    port_held,
    unknown_agent,
    unknown_graph,
    unknown_run,
    wrong_state,
)
from ._forwarded import (
    TrustedProxies,
    trusted_network,
)
from ._inherited import (  # issue 30, item 4: one address, many workers
    BACKLOG,
    bind_tcp_listener,
    inherited_bind,
    listener_url,
)
from ._request_body import (
    BODY_TIMEOUT_SECONDS,
    MAX_BODY_BYTES,
    Disconnected,
    asgi_chunks,
    read_body,
)
from ._requests import (
    MIN_TOKEN_BYTES,
    bearer_matches,
    object_from,
    parse_json,
    token_matches,
    unauthorized,
    whole_number,
)
from ._sessions import (
    SESSION_COOKIE,
    Logins,
    Session,
    Sessions,
    StoredSessions,
)
from ._throttle import (
    FAILED_TRIES,
    WINDOW_SECONDS,
    FailedTries,
    TooManyTries,
)
from ._tls import (
    tls_context,
)
from ._unix_socket import (
    UnixSocket,
    UnixSocketRefused,
    claim_unix_socket,
)
from ._untrusted import (  # issue 29, item 4: no request stalls the daemon
    UNTRUSTED_THREADS,
    off_loop,
)
from ._values import (
    HEADER_NAME,
    PLACEHOLDER,
    UnfillableHeader,
    fill_headers,
    header_placeholders,
    is_http_url,
    stray_placeholder,
)
from ._wording import (
    HTTP_WORDING,
)

if typing.TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import Any

    from hypercorn.config import Config


# The listener is hypercorn's protocol stack (h11, h2, wsproto): ~90 ms of imports that a `salvor
# run` of a built-in agent, a `resume` or a `log` never uses. It loads with the first listener.
def listener_config(bind: str, log_name: str, graceful_timeout: float) -> Config:
    """The settings of one of the daemon's listeners (``_listener.listener_config``)."""
    from ._listener import listener_config as settings

    return settings(bind, log_name, graceful_timeout)


async def serve(
    app: Any,
    config: Config,
    *,
    browsers: Browsers | None,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    tally: ConnectionTally | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` on ``config``'s binds until ``shutdown_trigger`` returns, every
    request first held to ``browsers`` (``_browsers``: Host, Origin, a JSON body's type; None
    when ``app`` holds them itself, ``guarded``); ``tally``: a worker's share of the connections
    (``_connection_share``).

    ``_listener.serve`` says the rest: what it reports, and that a failure to bind leaves nothing
    listening.
    """
    from ._listener import serve as serve_app

    await serve_app(
        app,
        config,
        browsers=browsers,
        shutdown_trigger=shutdown_trigger,
        tally=tally,
        task_status=task_status,
    )


__all__ = [
    "BACKLOG",
    "BODY_TIMEOUT_SECONDS",
    "CSRF_HEADER",
    "FAILED_TRIES",
    "HEADER_NAME",
    "HTTP_WORDING",
    "JSON_PORTS",
    "MAX_BODY_BYTES",
    "MIN_TOKEN_BYTES",
    "PLACEHOLDER",
    "SESSION_COOKIE",
    "UNTRUSTED_THREADS",
    "WINDOW_SECONDS",
    "Browsers",
    "Caller",
    "ConnectionTally",
    "Disconnected",
    "FailedTries",
    "Logins",
    "OperationRefused",
    "Session",
    "Sessions",
    "StoredSessions",
    "TooManyTries",
    "TrustedProxies",
    "UnfillableHeader",
    "UnixSocket",
    "UnixSocketRefused",
    "admit",
    "answer_lifespan",
    "asgi_chunks",
    "bad_request",
    "bearer_matches",
    "bind_tcp_listener",
    "canonical_host",
    "canonical_origin",
    "claim_unix_socket",
    "fill_headers",
    "guarded",
    "header_placeholders",
    "inherited_bind",
    "internal",
    "is_http_url",
    "is_json_media",
    "json_media_type",
    "listener_config",
    "listener_url",
    "media_type",
    "object_from",
    "off_loop",
    "parse_json",
    "peer_of",
    "port_held",
    "read_body",
    "serve",
    "stray_placeholder",
    "tls_context",
    "token_matches",
    "trusted_network",
    "unauthorized",
    "unknown_agent",
    "unknown_graph",
    "unknown_run",
    "unsupported_media_type",
    "whole_number",
    "wrong_state",
]
