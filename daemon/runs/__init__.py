"""Runs and their drivers: the Runtime (start, resume, resolve, abandon), the driver set, store
healing, the live event hub, who owns a store.

Rule: imports only the packages below it.
"""

from __future__ import annotations

from ._drivers import (
    DriverSet,
)
from ._event_hub import (
    EventHub,
    LiveEvent,
    event_frame,
)
from ._flow_catalog import (
    FlowCatalog,
)
from ._flow_host import (
    RunFlows,
    child_result,
)
from ._ownership import (
    SERVE,
    driving_run,
    own_store,
)
from ._runtime import (
    MISSING,
    ResumeOutcome,
    Runtime,
)

__all__ = [
    "MISSING",
    "SERVE",
    "DriverSet",
    "EventHub",
    "FlowCatalog",
    "LiveEvent",
    "ResumeOutcome",
    "RunFlows",
    "Runtime",
    "child_result",
    "driving_run",
    "event_frame",
    "own_store",
]
