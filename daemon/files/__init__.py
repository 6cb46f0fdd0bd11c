"""The file and shell tools of built-in agents, confined to the operator's workspace.

``read``, ``ls``, ``find`` and ``grep`` (reads), ``write`` and ``edit`` (writes, each planned by
a recorded read and probed after a crash), ``bash`` (a write nothing probes; off unless the
operator turns it on), each granted by name in a definition's ``tools`` and held to the
workspace and the definition's ``access`` globs.

Rule: imports only ``tools`` and ``processes`` (and what they stand on); knows files, not runs.
"""

from __future__ import annotations

from ._access import (
    GLOB_PATTERN,
    MAX_GLOB_CHARS,
    MAX_GLOBS,
    FileAccess,
)
from ._tool_set import (
    WRITE_PROBE,
    FileTools,
    file_tools,
)
from ._writing import (
    PLAN_FIELD,
    PLAN_TOOL,
    PROBE_TOOL,
    content_key,
    plan_input,
)

__all__ = [
    "GLOB_PATTERN",
    "MAX_GLOBS",
    "MAX_GLOB_CHARS",
    "PLAN_FIELD",
    "PLAN_TOOL",
    "PROBE_TOOL",
    "WRITE_PROBE",
    "FileAccess",
    "FileTools",
    "content_key",
    "file_tools",
    "plan_input",
]
