"""The tool registry (what a tool is, its effect, how a call is dispatched) and the demo tools.

Rule: imports only ``processes`` and below.
"""

from __future__ import annotations

from ._demo import (
    demo_registry,
)
from ._file_inputs import check_file_inputs
from ._registry import (
    DispatchFailed,
    MissingKeyField,
    NotPerformed,
    OutcomeUnknown,
    Probe,
    ProbeVerdict,
    SleepUntil,
    Suspend,
    Tool,
    ToolCall,
    ToolFailed,
    ToolRegistry,
    call_identity,
    check_key_paths,
    check_path,
    derived_key,
    dispatch,
    graph_call_key,
)

__all__ = [
    "DispatchFailed",
    "MissingKeyField",
    "NotPerformed",
    "OutcomeUnknown",
    "Probe",
    "ProbeVerdict",
    "SleepUntil",
    "Suspend",
    "Tool",
    "ToolCall",
    "ToolFailed",
    "ToolRegistry",
    "call_identity",
    "check_file_inputs",
    "check_key_paths",
    "check_path",
    "demo_registry",
    "derived_key",
    "dispatch",
    "graph_call_key",
]
