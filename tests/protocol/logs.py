"""The protocol tests' logs: the event builders and the two tables of cases, importable here.

The builders (``event_builders``) give each event, envelope and short log in its common shape.
``VIEW_CASES`` (``view_cases``) is the one table of (legal log, expected view): it feeds the fold
tests, the step-by-step tests and the guard's acceptance tests. ``REFUSALS`` (``refusal_cases``)
is the table of (legal prefix, illegal next envelope, reason).
"""

from __future__ import annotations

from .event_builders import (
    AGENT,
    APPROVAL_SCHEMA,
    GRAPH,
    GS,
    MODEL_STEP,
    OTHER_RUN,
    REQUEST,
    REQUEST_2,
    RUN,
    SIGNAL_SCHEMA,
    UNTYPED_SCHEMA,
    WAKE_AT,
    S,
    envelope,
    gate,
    graph_started,
    model,
    model_done,
    over_budget,
    pending_model,
    pending_tool,
    recorded_at,
    started,
    tool,
    tool_done,
    wrap,
    write,
)
from .refusal_cases import AT_WRITE, REFUSALS, Refusal
from .view_cases import COVERED_STATES, VIEW_CASES, ViewCase, legal_next

__all__ = [
    "AGENT",
    "APPROVAL_SCHEMA",
    "AT_WRITE",
    "COVERED_STATES",
    "GRAPH",
    "GS",
    "MODEL_STEP",
    "OTHER_RUN",
    "REFUSALS",
    "REQUEST",
    "REQUEST_2",
    "RUN",
    "SIGNAL_SCHEMA",
    "UNTYPED_SCHEMA",
    "VIEW_CASES",
    "WAKE_AT",
    "Refusal",
    "S",
    "ViewCase",
    "envelope",
    "gate",
    "graph_started",
    "legal_next",
    "model",
    "model_done",
    "over_budget",
    "pending_model",
    "pending_tool",
    "recorded_at",
    "started",
    "tool",
    "tool_done",
    "wrap",
    "write",
]
