"""The tool registry (what a tool is, its effect, how a call is dispatched), the demo tools, and
the operator's workspace the file tools are confined to.

Rule: imports only ``processes`` and ``skills`` (and what they stand on).
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
from ._workspace import (
    FILE_TOOLS,
    READ_TOOLS,
    SHELL_TIMEOUT_SECONDS,
    SHELL_TOOL,
    WRITE_TOOLS,
    Workspace,
)

__all__ = [
    "COPIES_PREFIX",
    "FILE_TOOLS",
    "READ_TOOLS",
    "SHELL_TIMEOUT_SECONDS",
    "SHELL_TOOL",
    "WRITE_TOOLS",
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
    "Workspace",
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
