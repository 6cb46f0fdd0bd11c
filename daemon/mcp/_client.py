"""An MCP client on trio: open a session with one server, over stdio or streamable HTTP.

The session itself (requests, deadlines, server messages, the three failure
kinds) is ``_mcp_session``; the transports are ``_mcp_stdio`` and
``_mcp_http``. This module picks the transport a server's definition names
and initialises the session.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import trio

from ._definition import McpServerSpec
from ._http_transport import HttpTransport, resolve_headers
from ._session import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    McpError,
    McpNoAnswer,
    McpRemoteError,
    McpSession,
    McpUnavailable,
)
from ._stdio_transport import open_stdio

__all__ = [
    "MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "McpError",
    "McpNoAnswer",
    "McpRemoteError",
    "McpSession",
    "McpUnavailable",
    "open_session",
]


async def open_session(
    spec: McpServerSpec,
    nursery: trio.Nursery,
    environ: Mapping[str, str] = os.environ,
    mark: Mapping[str, str] | None = None,
    initialize: dict | None = None,
) -> McpSession:
    """Start or reach the server and initialise a session with it.

    Its background tasks (a stdio server's readers) run in ``nursery``; the
    caller closes the session with ``aclose``. A stdio server carries
    ``mark`` in its environment: the orphan mark (``_orphans``) that lets a
    restarted daemon find it if this one is killed. ``initialize``: the
    parameters of the ``initialize`` request (salvor's own when None); its
    result is kept as ``session.initialized``.

    Raises:
        McpUnavailable: the server could not be started, reached or
            initialised; nothing is left running.
    """
    if spec.command is not None:
        session = await open_stdio(spec, nursery, environ, mark or {})
    else:
        session = McpSession(spec, HttpTransport(spec, resolve_headers(spec, environ)))
    try:
        session.initialized = await session.initialize(initialize)
    except McpUnavailable:
        await session.aclose()
        raise
    except McpError as exc:
        await session.aclose()
        # A JSON-RPC error's message is the remote's own text: a refusal never quotes it.
        detail = (
            exc.detail
            if getattr(exc, "error", None) is None
            else (f"answered initialize with a JSON-RPC error (code {exc.code})")
        )
        raise McpUnavailable(spec.name, f"did not start a session: it {detail}") from None
    except BaseException:
        await session.aclose()
        raise
    return session
