"""Work on what a caller sent, off the event loop: parsing a definition or a graph, compiling a
schema, checking a value against one.

Each is bounded before it starts (the parsers' and ``salvor.protocol``'s limits), but a bounded
parse can still take a good fraction of a second, and on the trio thread every other request,
``/v1/health`` included, would wait for it. On a worker thread it only shares the interpreter,
which switches threads every few milliseconds.

At most ``UNTRUSTED_THREADS`` such threads run at once, per ``trio.run``: a flood of requests
queues for them instead of starting a thread each (trio's default limiter allows 40, shared with
every other blocking call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

UNTRUSTED_THREADS = 2

_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("untrusted_limiter")


def _limiter() -> trio.CapacityLimiter:
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(UNTRUSTED_THREADS)
        _LIMITER.set(limiter)
        return limiter


async def off_loop(work: Callable[..., T], *args: object, shielded: bool = False) -> T:
    """``work(*args)`` on one of the untrusted-work threads; what it returns or raises.

    Cancellation: waits for ``work`` to finish (it is bounded), then raises ``Cancelled``; a
    caller still queued for a thread is cancelled at once. ``shielded``: not cancelled at all,
    for work between an effect and its record (a tool's answer read into its output), where a
    cancellation would lose what the effect returned.
    """
    with trio.CancelScope(shield=shielded):
        return await trio.to_thread.run_sync(work, *args, limiter=_limiter())
