"""The ``salvor serve`` lifetime: open the store, recover, listen, tell systemd, stop.

Rule: imports only the packages below it.
"""

from __future__ import annotations

from ._collector import (
    YOUNG_THRESHOLD,
    settle_collector,
)
from ._serve import (
    ServeConfig,
    serve,
)

__all__ = [
    "YOUNG_THRESHOLD",
    "ServeConfig",
    "serve",
    "settle_collector",
]
