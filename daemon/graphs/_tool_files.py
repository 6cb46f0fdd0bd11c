"""Tool files in a flow run: the files of the client's a tool node hands its tool.

A tool's declared file input (``Tool.file_inputs``) written in a flow's tool node as a literal
absolute ``.json``, ``.yaml``, ``.png`` or ``.txt`` path (a *file argument*,
``protocol.is_file_argument``) is looked up by that path as written: first a baseline an earlier
snapshot node of this walk captured at that path, then the members the client sent (role ``tool``,
or a baseline of the same path standing in for it). The tool is handed the bytes as a temporary
file of the daemon's, made just before its handler runs and removed once it returns; the call is
recorded with the client's path, so replay, recovery and forks see the same call. A process
killed while its tool reads leaves its copies behind; the next process to hand a tool a file
removes them.

A file argument with no member, or one the client marked missing, fails the node; a refused one
fails it with the client's reason. Any other value of a file input is read as it is only by a flow
run from this machine (not linked): over a link the pre-check refused it, and a graph run by hash
brings no file of the client's at all.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import trio
from salvor.protocol import (
    FileInputs,
    FlowMember,
    GraphNode,
    declared_arguments,
    is_file_argument,
)

from ..tools import COPIES_PREFIX, Tool, ToolCall, copies_home
from ._baseline_writes import baseline_bytes
from ._flow_check import FlowFiles, not_a_file_argument
from ._snapshot import CAPTURED


class ToolFileProblem(Exception):
    """A file argument the step cannot hand its tool; the message is the step's failure."""


def _member_bytes(files: FlowFiles, member: FlowMember, tool: str, argument: str) -> bytes:
    if member.state == "refused":
        raise ToolFileProblem(member.error or f"the client refused to send {member.key!r}")
    data = files.member_bytes(member)
    if data is None:
        raise ToolFileProblem(
            f'the client has no file at "{member.key}" (argument {argument} of {tool})'
        )
    return data


def client_file(
    files: FlowFiles | None,
    captured: Mapping[str, Any],
    path: str,
    tool: str,
    argument: str,
) -> bytes:
    """The bytes a file argument ``path`` stands for: a baseline captured earlier in this walk
    (``captured``: node id -> output), else the member keyed by ``path``.

    Raises:
        ToolFileProblem: no file at ``path`` (no member, or the client found none), or the
            client refused it (its reason).
    """
    for output in reversed(list(captured.values())):
        if (
            isinstance(output, dict)
            and output.get("baseline") == CAPTURED
            and output.get("path") == path
        ):
            return baseline_bytes(output.get("value"))
    member = None if files is None else files.bundle.members.get(path)
    if member is None:
        raise ToolFileProblem(f'the client has no file at "{path}" (argument {argument} of {tool})')
    return _member_bytes(files, member, tool, argument)


def staged_files(
    call: GraphNode,
    tool_input: Any,
    file_inputs: FileInputs,
    files: FlowFiles | None,
    captured: Mapping[str, Any],
) -> dict[str, tuple[str, bytes]]:
    """Each file argument of ``call`` (argument -> the client's path and its bytes) the tool is
    to be handed as a temporary file.

    Raises:
        ToolFileProblem: a file argument cannot be handed over (``client_file``), or a file
            input is given something else in a run not started on this machine.
    """
    staged: dict[str, tuple[str, bytes]] = {}
    local = files is not None and not files.bundle.linked
    for argument, written in declared_arguments(call, file_inputs):
        if not isinstance(tool_input, dict) or argument not in tool_input:
            continue  # the tool is given no such argument: nothing to hand over
        if is_file_argument(written):
            data = client_file(files, captured, written, call.tool, argument)
            staged[argument] = (written, data)
        elif not local:
            raise ToolFileProblem(not_a_file_argument(call.tool, argument, written))
    return staged


# Whether this process removed the copies of processes that are gone (its first handing does).
_swept = False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(home: str) -> None:
    """Remove the copies of processes that are gone (a daemon killed while a tool read one)."""
    for name in os.listdir(home):
        pid = name.partition("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(home, name), ignore_errors=True)


def _write_copies(staged: Mapping[str, tuple[str, bytes]]) -> tuple[str, dict[str, str]]:
    """A fresh directory holding a copy of each staged file, and each argument's copy.

    Raises:
        OSError: a copy could not be written (the tool's failure, as any of its own); the
            directory was removed.
    """
    global _swept
    home = copies_home()
    if home is not None and not _swept:
        _sweep(home)
        _swept = True
    # 0700: the daemon's user alone.
    directory = tempfile.mkdtemp(prefix=f"{os.getpid()}-" if home else COPIES_PREFIX, dir=home)
    paths = {}
    try:
        for index, (argument, (path, data)) in enumerate(sorted(staged.items())):
            # The client's file name, so a tool that goes by the suffix reads the same kind.
            copy = os.path.join(directory, f"{index}-{posixpath.basename(path)}")
            with open(copy, "xb", opener=lambda name, flags: os.open(name, flags, 0o600)) as out:
                out.write(data)
            paths[argument] = copy
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)  # a full disk leaves no partial copy
        raise
    return directory, paths


def handing_files(tool: Tool, staged: Mapping[str, tuple[str, bytes]]) -> Tool:
    """``tool`` whose handler is given a temporary copy of each staged file in place of the
    client's path. The copies exist only while the handler runs; the call as recorded (its
    name, input and key) is the client's."""
    if not staged:
        return tool
    handler = tool.handler

    async def with_copies(tool_input: Any, call: ToolCall) -> Any:
        directory, paths = await trio.to_thread.run_sync(_write_copies, staged)
        try:
            return await handler({**tool_input, **paths}, call)
        finally:
            # Shielded: a cancelled drive still leaves no copy of the client's bytes behind.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: shutil.rmtree(directory, ignore_errors=True))

    return replace(tool, handler=with_copies)
