"""The HTTP control plane: the Quart app, its routes one resource to a module (``_*_routes``, each
handler registered with its own ``Operation`` declaration), the append front, the OpenAPI document
built from those declarations, and the typed declarations (request bodies, the run list's query,
fixed-shape answers) that the handlers read and answer with and the document refers to.

Rule: handlers talk to the services (the Runtime, ClientRuns), never to the store behind them;
imports only the packages below it.
"""

from __future__ import annotations

from ._app import (
    create_app,
)
from ._front import (
    AppendFront,
)
from ._state import (
    ServerState,
    refuse_if_driven_elsewhere,
)
from ._stream_slots import (
    StreamSlots,
)

__all__ = [
    "AppendFront",
    "ServerState",
    "StreamSlots",
    "create_app",
    "refuse_if_driven_elsewhere",
]
