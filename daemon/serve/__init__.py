"""The ``salvor serve`` lifetime: open the store, recover, listen, tell systemd, stop.

Rule: imports only the packages below it.
"""

from __future__ import annotations

from ._serve import (
    ServeConfig,
    serve,
)

__all__ = [
    "ServeConfig",
    "serve",
]
