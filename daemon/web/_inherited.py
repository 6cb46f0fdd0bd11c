"""Listening sockets bound once and served by other processes (``salvor serve --workers N``).

The supervisor binds and listens; each worker inherits the descriptor and serves it
(hypercorn's ``fd://N`` bind), so one address serves them all and the kernel hands each new
connection to whichever worker accepts first. A worker that dies takes none of the queue with
it: the socket stays open in the supervisor and the other workers.
"""

from __future__ import annotations

import socket

# Connections the kernel queues for the workers to accept (hypercorn's own backlog is 100, for
# one process).
BACKLOG = 1024


def bind_tcp_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port) and listening, as hypercorn would bind
    it (IPv6 when the host is an IPv6 literal). Blocking.

    Raises:
        OSError: the address cannot be bound; nothing is left open.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def listener_url(sock: socket.socket) -> str:
    """What a listener reports it serves, as ``salvor serve`` prints it: ``http://HOST:PORT``, or
    ``unix:PATH``."""
    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


def inherited_bind(fd: int) -> str:
    """hypercorn's bind (``fd://N``) for a listening stream socket this process inherited.

    Raises:
        ValueError: ``fd`` is not a listening stream socket (nothing is closed).
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        raise ValueError(f"descriptor {fd} is not a socket this process inherited") from None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        stream = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM
    finally:
        sock.detach()
    if not (listening and stream):
        raise ValueError(f"descriptor {fd} is not a listening stream socket")
    return f"fd://{fd}"
