"""Whether a process is gone, for tests that kill process trees.

A killed process whose parent never reaps it stays a zombie (state ``Z``)
until init gets to it, and a container's init may never do so: it holds a
pid but runs nothing, so it counts as gone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # The state follows the parenthesised command name, which may hold spaces.
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def wait_gone(pid: int, seconds: float = 30.0) -> bool:
    """Whether the process is gone (or a zombie), polled until it is or ``seconds`` pass.

    The bound is for a process that never goes, not a guess at how long going takes.
    """
    deadline = time.monotonic() + seconds
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
