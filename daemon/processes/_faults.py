"""Fault injection for the kill-safety suites: a real SIGKILL at a chosen instant.

Off unless the environment asks for it. ``SALVOR_FAULT_KILL_AFTER_SEQ=N``
kills the process right after the commit that made seq N durable;
``SALVOR_FAULT_KILL_IN_TOOL=name`` kills it inside that tool, after its side
effect and before its completion is recorded. Nothing runs after the signal,
exactly as after a power cut.

The commit hook is asked for once, when the store's writer is set up; with
the variable unset there is no hook, so an append pays nothing for it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping

AFTER_SEQ_VAR = "SALVOR_FAULT_KILL_AFTER_SEQ"
IN_TOOL_VAR = "SALVOR_FAULT_KILL_IN_TOOL"


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_after_commit_hook(
    environ: Mapping[str, str] = os.environ,
) -> Callable[[int, int], None] | None:
    """The hook to call once a batch covering ``first_seq..last_seq`` is durable, or None when off.

    Raises:
        ValueError: the variable is set but is not a whole number; nothing was installed.
    """
    raw = environ.get(AFTER_SEQ_VAR)
    if raw is None:
        return None
    try:
        at = int(raw)
    except ValueError:
        raise ValueError(f"{AFTER_SEQ_VAR} must be a whole number, not {raw!r}") from None

    def kill_after_commit(first_seq: int, last_seq: int) -> None:
        if first_seq <= at <= last_seq:
            _die()

    return kill_after_commit


def kill_if_requested(tool: str, environ: Mapping[str, str] = os.environ) -> None:
    """Called by a tool after its effect happened, before it returns."""
    # Read at the call, not at import: the test suite forks its salvor processes from an
    # interpreter that imported the package before their environment was known.
    if environ.get(IN_TOOL_VAR) == tool:
        _die()
