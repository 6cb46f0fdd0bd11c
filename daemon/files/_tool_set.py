"""The file tools one agent is granted, built over the workspace and its access globs.

Each tool's blocking work (every ``open``, ``stat``, walk and hash) runs on a worker thread;
``bash`` waits on its process under trio. Without a workspace (a definition stored while the
daemon had one, driven by a daemon without) each call is the agent's error saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from salvor.protocol import Effect

from ..tools import FILE_TOOLS, SHELL_TOOL, Probe, Tool, ToolCall, ToolFailed, Workspace
from ._access import FileAccess
from ._confine import Confinement
from ._reading import list_folder, read_text
from ._searching import find_files, grep_files
from ._shell import run_command
from ._writing import PLAN_FIELD, PLAN_TOOL, PROBE_TOOL, file_holds, perform_change, plan_change

_PATH = {
    "type": "string",
    "description": "a path relative to the workspace, or the absolute path of a skill's file",
}
_LIMIT = {"type": "integer", "minimum": 1}
_SCHEMAS: dict[str, dict] = {
    "read": {
        "type": "object",
        "properties": {"path": _PATH, "offset": {"type": "integer", "minimum": 1}, "limit": _LIMIT},
        "required": ["path"],
    },
    "ls": {"type": "object", "properties": {"path": _PATH, "limit": _LIMIT}},
    "find": {
        "type": "object",
        "properties": {"pattern": {"type": "string"}, "path": _PATH, "limit": _LIMIT},
        "required": ["pattern"],
    },
    "grep": {
        "type": "object",
        "properties": {
            "pattern": {"type": "string"},
            "path": _PATH,
            "glob": {"type": "string"},
            "ignore_case": {"type": "boolean"},
            "literal": {"type": "boolean"},
            "limit": _LIMIT,
        },
        "required": ["pattern"],
    },
    "write": {
        "type": "object",
        "properties": {"path": _PATH, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
    "edit": {
        "type": "object",
        "properties": {
            "path": _PATH,
            "old_text": {"type": "string"},
            "new_text": {"type": "string"},
            "replace_all": {"type": "boolean"},
        },
        "required": ["path", "old_text", "new_text"],
    },
    SHELL_TOOL: {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["command"],
    },
}
_DESCRIPTIONS = {
    "read": "Read a text file of the workspace (or of a skill), from line `offset` (1-based), "
    "`limit` lines.",
    "ls": "List a folder of the workspace (folders end in /, links in @).",
    "find": "Find files by glob (`*.md` by name, `docs/**/*.md` by path) below `path`.",
    "grep": "Search files below `path` for lines matching a regular expression.",
    "write": "Write a whole file of the workspace (made, with its folders, when missing).",
    "edit": "Replace `old_text`, found exactly once (or every time with replace_all), by "
    "`new_text` in a file of the workspace.",
    SHELL_TOOL: "Run a shell command in the workspace; its exit code and the end of its output.",
}
_PLAN_SCHEMA = {"type": "object", "properties": {"tool": {"enum": ["write", "edit"]}}}
_PROBE_SCHEMA = {"type": "object", "properties": {"expect": {"type": "object"}}}
# A write or edit's probe: its planned change, and the answer's verdict and output.
WRITE_PROBE = Probe(
    tool=PROBE_TOOL, input={PLAN_FIELD: PLAN_FIELD}, landed="landed", output="output"
)


@dataclass(frozen=True, slots=True)
class FileTools:
    """An agent's file tools by name; the read that plans a write or an edit; the read that
    probes one."""

    tools: dict[str, Tool]
    planner: Tool
    prober: Tool


def _threaded(confined: Confinement | None, work: Callable[[Confinement, Any], Any]):
    async def handler(tool_input: Any, call: ToolCall) -> Any:
        if confined is None:
            raise ToolFailed(
                "this daemon has no workspace, so its file tools are unavailable (the operator "
                "gives one with --workspace)",
                retryable=False,
            )
        return await trio.to_thread.run_sync(work, confined, tool_input)

    return handler


def file_tools(
    workspace: Workspace | None,
    access: FileAccess | None,
    names: Iterable[str],
    mark: Mapping[str, str] | None = None,
    skill_folders: Sequence[str] = (),
) -> FileTools:
    """The file tools of ``names`` (the others are ignored), confined to ``workspace`` and
    ``access`` (None: the default, read everything, write nothing), and reading the whole of each
    of ``skill_folders`` (the agent's resolved skills'; without a workspace, only those);
    ``mark``: the orphan marks a shell command carries (``processes.MARK_VAR`` and ``RUN_VAR``)."""
    confined = (
        None
        if workspace is None and not skill_folders
        else Confinement(workspace, access or FileAccess(), tuple(skill_folders))
    )
    works: dict[str, Callable[[Confinement, Any], Any]] = {
        "read": read_text,
        "ls": list_folder,
        "find": find_files,
        "grep": grep_files,
        "write": partial(_perform, "write"),
        "edit": partial(_perform, "edit"),
    }
    tools: dict[str, Tool] = {}
    for name in names:
        if name not in FILE_TOOLS:
            continue
        writes = name in ("write", "edit", SHELL_TOOL)
        if name == SHELL_TOOL:
            handler = _shell_handler(workspace, mark)
        else:
            handler = _threaded(confined, works[name])
        tools[name] = Tool(
            name=name,
            description=_DESCRIPTIONS[name],
            effect=Effect.WRITE if writes else Effect.READ,
            input_schema=_SCHEMAS[name],
            handler=handler,
            probe=WRITE_PROBE if name in ("write", "edit") else None,
        )
    return FileTools(
        tools=tools,
        planner=Tool(
            name=PLAN_TOOL,
            description="What a write or an edit of the workspace is to change.",
            effect=Effect.READ,
            input_schema=_PLAN_SCHEMA,
            handler=_threaded(confined, plan_change),
        ),
        prober=Tool(
            name=PROBE_TOOL,
            description="Whether a planned write or edit of the workspace landed.",
            effect=Effect.READ,
            input_schema=_PROBE_SCHEMA,
            handler=_threaded(confined, file_holds),
        ),
    )


def _perform(tool: str, confined: Confinement, tool_input: Any) -> Any:
    return perform_change(confined, tool, tool_input)


def _shell_handler(workspace: Workspace | None, mark: Mapping[str, str] | None):
    async def handler(tool_input: Any, call: ToolCall) -> Any:
        if workspace is None:
            raise ToolFailed(
                "this daemon has no workspace, so `bash` is unavailable", retryable=False
            )
        return await run_command(workspace, tool_input, mark)

    return handler
