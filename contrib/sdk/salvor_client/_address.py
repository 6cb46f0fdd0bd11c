"""Where a daemon is: an ``http://`` or ``https://`` URL, or ``unix:PATH`` for one listening on a
Unix socket (``salvor serve --listen unix:PATH``, which only its own user can open)."""

from __future__ import annotations

import httpx

UNIX = "unix:"
# The origin requests over a Unix socket name: curl sends ``Host: localhost`` too.
UNIX_ORIGIN = "http://localhost"


def unix_socket_of(base_url: str) -> str | None:
    """The socket's path when ``base_url`` is ``unix:PATH``, else None."""
    if base_url.startswith(UNIX):
        return base_url.removeprefix(UNIX)
    return None


def http_origin(base_url: str) -> str:
    """The origin requests go to: the URL itself, or ``http://localhost`` over a Unix socket."""
    return UNIX_ORIGIN if unix_socket_of(base_url) is not None else base_url.rstrip("/")


def async_client(base_url: str, timeout: float) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that reaches the daemon at ``base_url`` (over its Unix socket
    when it names one)."""
    path = unix_socket_of(base_url)
    if path is None:
        return httpx.AsyncClient(timeout=timeout)
    return httpx.AsyncClient(timeout=timeout, transport=httpx.AsyncHTTPTransport(uds=path))
