"""HTTP plumbing: the listener, ASGI helpers, the one body reader, strict JSON bodies, the error
envelope and its refusals, request values, outbound TLS. ``ErrorCode`` (code -> status, defined in
``salvor.protocol``) is re-exported here for the HTTP layer.

Rule: knows HTTP, not runs. Imports nothing else from the daemon, and no web framework (Quart is
the HTTP API's, so a CLI run never loads it).
"""

from __future__ import annotations

from ._asgi import (
    answer_lifespan,
)
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
from ._listener import (
    listener_config,
    serve,
)
from ._request_body import (
    BODY_TIMEOUT_SECONDS,
    Disconnected,
    asgi_chunks,
    read_body,
)
from ._requests import (
    bearer_matches,
    object_from,
    parse_json,
    unauthorized,
    whole_number,
)
from ._tls import (
    tls_context,
)
from ._values import (
    HEADER_NAME,
    PLACEHOLDER,
    header_placeholders,
    is_http_url,
    stray_placeholder,
)

__all__ = [
    "BODY_TIMEOUT_SECONDS",
    "HEADER_NAME",
    "PLACEHOLDER",
    "Disconnected",
    "OperationRefused",
    "answer_lifespan",
    "asgi_chunks",
    "bad_request",
    "bearer_matches",
    "header_placeholders",
    "internal",
    "is_http_url",
    "listener_config",
    "object_from",
    "parse_json",
    "port_held",
    "read_body",
    "serve",
    "stray_placeholder",
    "tls_context",
    "unauthorized",
    "unknown_agent",
    "unknown_graph",
    "unknown_run",
    "whole_number",
    "wrong_state",
]
