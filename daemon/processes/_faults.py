"""Fault injection for the kill-safety suites: a real SIGKILL at a chosen instant.

Off unless the environment asks for it. ``SALVOR_FAULT_KILL_AFTER_SEQ=N``
kills the process right after the commit that made seq N durable;
``SALVOR_FAULT_KILL_IN_TOOL=name`` kills it inside that tool, after its side
effect and before its completion is recorded. Nothing runs after the signal,
exactly as after a power cut.
"""

from __future__ import annotations

import os
import signal

_AFTER_SEQ = os.environ.get("SALVOR_FAULT_KILL_AFTER_SEQ")
_IN_TOOL = os.environ.get("SALVOR_FAULT_KILL_IN_TOOL")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_after_commit(first_seq: int, last_seq: int) -> None:
    """Called once a batch covering ``first_seq..last_seq`` is durable."""
    if _AFTER_SEQ is not None and first_seq <= int(_AFTER_SEQ) <= last_seq:
        _die()


def kill_if_requested(tool: str) -> None:
    """Called by a tool after its effect happened, before it returns."""
    if _IN_TOOL == tool:
        _die()
