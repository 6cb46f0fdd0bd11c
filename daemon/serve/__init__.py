"""The ``salvor serve`` lifetime: open the store, recover, listen, tell systemd, stop.

Rule: imports only the packages below it.
"""

from __future__ import annotations

from ._collector import (
    YOUNG_THRESHOLD,
    settle_collector,
)
from ._serve import (
    serve,
)
from ._serve_config import (
    ServeConfig,
)
from ._worker_role import (
    WorkerRole,
)
from ._workers import (
    CrashLoop,
    supervise,
    unshared_store,
)

__all__ = [
    "YOUNG_THRESHOLD",
    "CrashLoop",
    "ServeConfig",
    "WorkerRole",
    "serve",
    "settle_collector",
    "supervise",
    "unshared_store",
]
