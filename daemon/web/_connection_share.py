"""How the workers of ``salvor serve --workers N`` share out the connections of their one
listening socket.

The kernel hands a queued connection to whichever worker calls ``accept`` first, and a worker
that is awake when a burst arrives takes it nearly all: 32 connections opened together split
3 to 29 and 25 to 7 between two idle workers. A kept-alive connection then stays with the
worker that accepted it, every request on it too, so one worker drove every run while the other
idled. So the workers keep a tally of their open connections in a small shared memory the
supervisor makes (``ConnectionTally``: one slot per worker, written by its worker only; -1 while
no worker serves in it), and a worker ahead of a serving sibling by more than one connection
leaves a waiting connection to that sibling for up to ``DEFER_SECONDS`` before it takes the
connection itself. A burst spreads evenly, and no connection waits longer than that for a
sibling that is busy, stopped or dead (its slot stale until the supervisor marks it -1).

Rules of this module:

* The tally orders who accepts, it guards nothing: a stale or torn reading costs at most one
  deferral. Each slot is one aligned 8-byte word, written only by its own worker (the trio
  thread) or, once that worker has ended, by the supervisor.
* A lone daemon (no tally) accepts as trio's ``serve_listeners`` does.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import socket
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("salvor.http")

# How long a worker ahead of a sibling leaves a waiting connection to it, at most.
DEFER_SECONDS = 0.02
# How often a deferring worker looks again whether a sibling took the connection.
_DEFER_POLL_SECONDS = 0.001
# A worker may hold this many connections more than a serving sibling before it defers.
SLACK = 1
# What a full process (descriptors, memory) makes accept fail with; tried again later (trio's).
_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_CAPACITY_PAUSE_SECONDS = 0.1
_SLOT_BYTES = 8
_NOT_SERVING = -1


class ConnectionTally:
    """The open connections of each worker, in memory every worker maps (an ``memfd``)."""

    def __init__(self, fd: int, index: int | None = None) -> None:
        """Map the tally at ``fd`` (the supervisor's, or a worker's inherited copy); ``index``:
        this worker's slot (None: the supervisor's view, serving in none)."""
        size = os.fstat(fd).st_size
        self._map = mmap.mmap(fd, size)
        self._slots = memoryview(self._map).cast("q")
        self.fd = fd
        self.index = index

    @classmethod
    def create(cls, workers: int) -> ConnectionTally:
        """A new tally for ``workers`` slots, none serving (the supervisor's)."""
        fd = os.memfd_create("salvor-connections", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, workers * _SLOT_BYTES)
            tally = cls(fd)
        except BaseException:
            os.close(fd)
            raise
        for slot in range(workers):
            tally.mark_not_serving(slot)
        return tally

    def mark_not_serving(self, slot: int) -> None:
        """No worker serves in ``slot`` (it ended): its siblings defer nothing to it."""
        self._slots[slot] = _NOT_SERVING

    def serving(self) -> None:
        """This worker serves, with no connection yet."""
        self._slots[self.index] = 0

    def opened(self) -> None:
        self._slots[self.index] += 1

    def closed(self) -> None:
        self._slots[self.index] -= 1

    def ahead(self) -> bool:
        """Whether this worker holds more than ``SLACK`` connections more than a serving
        sibling."""
        mine = self._slots[self.index]
        return any(
            0 <= count < mine - SLACK
            for slot, count in enumerate(self._slots)
            if slot != self.index
        )

    def counts(self) -> list[int]:
        return list(self._slots)

    def close(self) -> None:
        self._slots.release()
        self._map.close()
        os.close(self.fd)


async def serve_tallied(
    sock: socket.socket,
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    handler_nursery: trio.Nursery,
    tally: ConnectionTally,
) -> None:
    """Accept connections on the shared listening ``sock`` until cancelled, each served by
    ``handler`` in ``handler_nursery``, deferring to siblings as the tally says.

    Raises:
        OSError: accept failed, and not for a full process (out of descriptors or memory: that
            is logged and tried again after a pause, as trio's ``serve_listeners`` does).
    """
    sock.setblocking(False)
    tally.serving()
    with sock:
        await _accept_loop(sock, handler, handler_nursery, tally)


async def _accept_loop(
    sock: socket.socket,
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    handler_nursery: trio.Nursery,
    tally: ConnectionTally,
) -> None:

    async def served(stream: trio.SocketStream) -> None:
        try:
            await handler(stream)
        finally:
            tally.closed()
            await trio.aclose_forcefully(stream)

    while True:
        await trio.lowlevel.wait_readable(sock)
        if tally.ahead():
            with trio.move_on_after(DEFER_SECONDS):
                while tally.ahead():
                    await trio.sleep(_DEFER_POLL_SECONDS)
        try:
            connection, _ = sock.accept()
        except BlockingIOError:
            continue  # a sibling took it
        except OSError as exc:
            if exc.errno not in _CAPACITY_ERRNOS:
                raise
            log.error("accept failed (%s); trying again shortly", os.strerror(exc.errno))
            await trio.sleep(_CAPACITY_PAUSE_SECONDS)
            continue
        tally.opened()
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(connection))
        handler_nursery.start_soon(served, stream)
