"""The operator's workspace: the one folder the file tools of built-in agents may touch.

A value only (the tools themselves are ``salvor.daemon.files``'): where the folder is, whether
the shell tool is on, and how long a command may run. The registry carries it, so everything
that checks a definition's tool names, and every drive that builds an agent's tools, sees the
same one.
"""

from __future__ import annotations

from dataclasses import dataclass

# The file tools, each granted by name in a built-in agent's `tools`.
READ_TOOLS = ("read", "ls", "find", "grep")
WRITE_TOOLS = ("write", "edit")
SHELL_TOOL = "bash"
FILE_TOOLS = (*READ_TOOLS, *WRITE_TOOLS, SHELL_TOOL)
# How long a shell command may run when neither the call nor the operator says (seconds).
SHELL_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Workspace:
    """``root``: the folder, resolved (no symbolic link in it). ``shell``: whether ``bash`` is
    offered (off unless the operator turns it on). ``shell_timeout``: the longest a command
    runs, in seconds; a call may ask for less, never more."""

    root: str
    shell: bool = False
    shell_timeout: float = SHELL_TIMEOUT_SECONDS

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The file tools this workspace offers."""
        return FILE_TOOLS if self.shell else (*READ_TOOLS, *WRITE_TOOLS)
