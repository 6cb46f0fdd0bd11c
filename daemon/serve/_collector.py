"""The serving process's garbage collector, set for a daemon with many live streams.

CPython collects its youngest generation every 700 net container allocations, and each
collection promotes what is alive at that instant; with a thousand streams each mid-write,
much is. In ``bench_sse``'s live phase (1,000 subscribers) the collector at its defaults ran
about sixty times a second and took a third of the trio thread's time, its full collections
pausing every stream for a quarter of a second each. Collected ten times less often, the young
generation's short-lived objects (an ASGI message, a chunk, a cancel scope) are freed by their
reference counts before any collection sees them, and nothing is promoted in a steady stream.
"""

from __future__ import annotations

import gc

# Container allocations (net) between two collections of the youngest generation.
YOUNG_THRESHOLD = 10_000


def settle_collector() -> None:
    """Set this process's collector for serving: freeze what exists now (the modules and what
    they built live as long as the process, and are then never scanned again) and collect the
    youngest generation every ``YOUNG_THRESHOLD`` allocations. The older generations keep
    their thresholds. For the ``salvor serve`` process only: it changes the whole process.
    """
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
