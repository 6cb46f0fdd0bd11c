"""``bash``: one shell command in the workspace, tied to the daemon, bounded in time and output.

The command runs through the process tether (``open_tied_process``) in a process group of its
own, so it dies with the daemon (a SIGKILL included) and a timeout kills all it started. Its
environment is the daemon's allow-list for children (``child_environment``): no key, token or
store URL of the daemon's reaches it. Its folder is the workspace, and its stdin is empty.

The shell is no sandbox: a command reaches whatever the daemon's user can. That is why it is off
unless the operator turns it on, and why a call of it is a ``write`` without a probe: found open
after a crash, it waits for a person and is never run again by itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

import trio

from ..processes import (
    OWNER_VAR,
    child_environment,
    kill_group,
    kill_if_requested,
    open_tied_process,
    owner_mark,
)
from ..tools import SHELL_TOOL, ToolFailed, Workspace

# The most of a command's output (stdout and stderr together) an answer carries: its end.
OUTPUT_BYTES = 64 * 1024
_CHUNK = 16 * 1024


def _shell() -> str:
    return shutil.which("bash") or "/bin/sh"


def _timeout(workspace: Workspace, asked: Any) -> float:
    if asked is None:
        return workspace.shell_timeout
    if type(asked) not in (int, float) or not 0 < asked:
        raise ToolFailed("`timeout` must be a positive number of seconds", retryable=False)
    return min(float(asked), workspace.shell_timeout)


async def _drain(stream: trio.abc.ReceiveStream, tail: bytearray, seen: list[int]) -> None:
    while chunk := await stream.receive_some(_CHUNK):
        seen[0] += len(chunk)
        tail.extend(chunk)
        del tail[: max(0, len(tail) - OUTPUT_BYTES)]


def _environment(workspace: Workspace, mark: Mapping[str, str]) -> dict[str, str]:
    """The children's allow-list, and the orphan marks (``mark``: the store's and the run's;
    this process as owner), so a command that left its group is still found by the start-up
    sweep once this daemon is gone."""
    env = {**child_environment(os.environ), "PWD": workspace.root, **mark}
    if mark:
        env[OWNER_VAR] = owner_mark()
    return env


async def run_command(
    workspace: Workspace, tool_input: dict, mark: Mapping[str, str] | None = None
) -> dict:
    """Run ``command`` with ``bash -c`` in the workspace; its exit code (None past the timeout)
    and the end of its output.

    Raises:
        ToolFailed: the operator has not turned the shell on, or the shell could not start.

    Cancellation: the command's process group is killed and waited for.
    """
    if not workspace.shell:
        raise ToolFailed(
            "`bash` is off on this daemon: the operator starts it with --allow-bash to offer it",
            retryable=False,
        )
    command = tool_input.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolFailed("`command` must be a shell command", retryable=False)
    timeout = _timeout(workspace, tool_input.get("timeout"))
    try:
        process = await open_tied_process(
            [_shell(), "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=workspace.root,
            env=_environment(workspace, mark or {}),
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolFailed(f"the shell could not start: {exc.strerror or exc}") from None
    tail, seen = bytearray(), [0]
    try:
        with trio.move_on_after(timeout) as bounded:
            await _drain(process.stdout, tail, seen)
            await process.wait()
    finally:
        # What the command left running in its group goes with it (a shell's `&` included).
        kill_group(process.pid)
        if process.returncode is None:
            with trio.CancelScope(shield=True):
                await process.wait()
        await process.stdout.aclose()
    kill_if_requested(SHELL_TOOL)
    answer: dict[str, Any] = {
        "exit_code": None if bounded.cancelled_caught else process.returncode,
        "output": tail.decode("utf-8", errors="replace"),
    }
    if bounded.cancelled_caught:
        answer["timed_out"] = f"killed after {timeout:g}s"
    if seen[0] > len(tail):
        answer["output_cut"] = f"the last {len(tail)} of {seen[0]} bytes"
    return answer
