"""The tool registry (what a tool is, its effect, how a call is dispatched) and the demo tools.

Rule: imports only ``processes`` and below.
"""

from __future__ import annotations

from ._demo import (
    demo_registry,
)
from ._file_inputs import COPIES_PREFIX, check_file_inputs, copies_home, handed_copy
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
    "COPIES_PREFIX",
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
    "copies_home",
    "demo_registry",
    "derived_key",
    "dispatch",
    "graph_call_key",
    "handed_copy",
]
