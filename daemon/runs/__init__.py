"""Runs and their drivers: the Runtime (the drive of a run, and its services: definitions, reads,
starts, control, forks), the driver set, store healing, the live event hub and its WebSocket
connections, who owns a store.

Rule: imports only the packages below it.
"""

from __future__ import annotations

from ._change_feed import (
    ChangeFeed,
    DataVersionFeed,
    InProcessFeed,
    NoticeFeed,
    change_feed,
)
from ._definitions import (
    Definitions,
)
from ._drivers import (
    DriverSet,
)
from ._event_hub import (
    MAX_STREAMS_PER_CLIENT,
    PAGE_BYTES,
    PAGE_EVENTS,
    Batching,
    EventHub,
)
from ._flow_catalog import (
    FlowCatalog,
)
from ._flow_host import (
    RunFlows,
    child_result,
)
from ._flow_names import (
    FlowNames,
    flow_name_parts,
    unknown_flow,
)
from ._forks import (
    Forks,
)
from ._live_connection import (
    MAX_MESSAGE_BYTES,
    LiveConnection,
    Outbox,
)
from ._live_events import (
    LiveEvent,
    RunChange,
    event_frame,
    event_message,
)
from ._ownership import (
    SERVE,
    driving_run,
    own_store,
)
from ._run_control import (
    MISSING,
    ResumeDecision,
    ResumeOutcome,
    RunControl,
)
from ._run_reads import (
    RunReads,
    driver_of,
)
from ._run_starts import (
    RunStarts,
)
from ._runtime import (
    Runtime,
)
from ._subscription import (
    BUFFER_BYTES,
    Subscription,
)
from ._uploads import (
    Uploads,
)

__all__ = [
    "BUFFER_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_STREAMS_PER_CLIENT",
    "MISSING",
    "PAGE_BYTES",
    "PAGE_EVENTS",
    "SERVE",
    "Batching",
    "ChangeFeed",
    "DataVersionFeed",
    "Definitions",
    "DriverSet",
    "EventHub",
    "FlowCatalog",
    "FlowNames",
    "Forks",
    "InProcessFeed",
    "LiveConnection",
    "LiveEvent",
    "NoticeFeed",
    "Outbox",
    "ResumeDecision",
    "ResumeOutcome",
    "RunChange",
    "RunControl",
    "RunFlows",
    "RunReads",
    "RunStarts",
    "Runtime",
    "Subscription",
    "Uploads",
    "change_feed",
    "child_result",
    "driver_of",
    "driving_run",
    "event_frame",
    "event_message",
    "flow_name_parts",
    "own_store",
    "unknown_flow",
]
