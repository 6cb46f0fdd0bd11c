"""The names a run's log is written in: event kinds, tool effects, the actors a payload names,
budget kinds, and the sentinel keys a tool call's recorded output may carry.

Pure data: every other protocol module may take these without taking the events themselves.
"""

from __future__ import annotations

import enum


class EventKind(enum.StrEnum):
    RUN_STARTED = "RunStarted"
    MODEL_CALL_REQUESTED = "ModelCallRequested"
    MODEL_CALL_COMPLETED = "ModelCallCompleted"
    TOOL_CALL_REQUESTED = "ToolCallRequested"
    TOOL_CALL_COMPLETED = "ToolCallCompleted"
    NOW_OBSERVED = "NowObserved"
    RANDOM_OBSERVED = "RandomObserved"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    SLEEP_STARTED = "SleepStarted"
    SLEEP_COMPLETED = "SleepCompleted"
    BUDGET_EXCEEDED = "BudgetExceeded"
    RUN_COMPLETED = "RunCompleted"
    RUN_FAILED = "RunFailed"
    RUN_ABANDONED = "RunAbandoned"
    # A graph run's head and the narration of its walk.
    GRAPH_RUN_STARTED = "GraphRunStarted"
    NODE_ENTERED = "NodeEntered"
    NODE_EXITED = "NodeExited"
    NODE_SKIPPED = "NodeSkipped"
    MAP_ITEM_COMPLETED = "MapItemCompleted"
    # Tools the operator (or an agent in edit mode) attached to the run's tree at run time.
    TOOLS_ATTACHED = "ToolsAttached"


class Effect(enum.StrEnum):
    """What executing a tool again would do to the world."""

    READ = "read"
    IDEMPOTENT = "idempotent"
    WRITE = "write"


class Actor(enum.StrEnum):
    """Who, besides the daemon, did what a payload records (absent: the daemon did it).

    ``performed_by`` and ``driven_by`` name the client (it performed the call,
    it drives the run); ``settled_by`` names who recorded a write's outcome
    after its intent was left open: the operator, by hand, or the write's
    probe, which read the world and found it landed.
    """

    CLIENT = "client"
    OPERATOR = "operator"
    PROBE = "probe"


BUDGET_KINDS = ("steps", "tokens", "cost_usd", "wall_time_seconds")

# The sentinel keys the runtime writes into a ToolCallCompleted output.
TOOL_ERROR_KEY = "__salvor_error"
TOOL_SLEEP_KEY = "__salvor_sleep"
TOOL_SUSPEND_KEY = "__salvor_suspend"
