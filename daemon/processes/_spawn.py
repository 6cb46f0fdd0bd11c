"""Starting a child process (an agent, a stdio MCP server) that cannot outlive this process.

``open_tied_process`` is ``trio.lowlevel.open_process`` with the command run
through the tether (``_tether``): the child gets the pid, group, stdio and
exit status it would have had, and is SIGKILLed with its process group the
moment this process is gone, a SIGKILL included. Off Linux it is a plain
``open_process``, and the start-up orphan sweep is all there is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

TETHER = str(Path(__file__).with_name("_tether.py"))


def _interpreter() -> str:
    """The binary running this process: the tether needs no venv (it runs with ``-I -S``), and a
    venv's ``sys.executable`` can be a link the daemon's user may not follow
    even though its target runs."""
    try:
        return os.readlink("/proc/self/exe")
    except OSError:
        return sys.executable


_ERRNO_BYTES = 16


def tethered(command: Sequence[str], errfd: int) -> list[str]:
    """The command line that runs ``command`` through the tether, reporting
    a failed exec on ``errfd``."""
    # -I -S: no site, no user paths, nothing of salvor's: a bare interpreter starts in milliseconds.
    return [_interpreter(), "-I", "-S", TETHER, str(errfd), "--", *command]


async def open_tied_process(command: Sequence[str], **options: Any) -> trio.Process:
    """Start ``command`` (options as for
    ``trio.lowlevel.open_process``) tied to this process's life.

    Raises:
        OSError: the command could not be started (the errno its exec failed
            with, as a direct start raises it); nothing is left running.
    """
    if not sys.platform.startswith("linux"):
        return await trio.lowlevel.open_process(list(command), **options)
    read_end, write_end = os.pipe()
    try:
        process = await trio.lowlevel.open_process(
            tethered(command, write_end),
            pass_fds=(*options.pop("pass_fds", ()), write_end),
            **options,
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    # End of file: the command was exec'd. Some bytes: the errno of its failed exec.
    report = b""
    try:
        async with trio.lowlevel.FdStream(read_end) as reader:
            while chunk := await reader.receive_some(_ERRNO_BYTES):
                report += chunk
    except BaseException:
        process.kill()  # cancelled between fork and exec: nothing may be left running
        with trio.CancelScope(shield=True):
            await process.wait()
        raise
    if not report:
        return process
    with trio.CancelScope(shield=True):
        await process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            await stream.aclose()
    code = int(report) if report.isdigit() else 0
    raise OSError(
        code, os.strerror(code) if code else "the command could not be executed", command[0]
    )
