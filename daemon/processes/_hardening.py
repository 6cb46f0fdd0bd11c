"""Making the daemon's own process unreadable to other processes of its user.

``make_undumpable`` sets ``prctl(PR_SET_DUMPABLE, 0)``: no core dump, no
ptrace attach, and the kernel makes ``/proc/<pid>/environ``, ``mem``,
``maps`` and the like owned by root, so an agent (or anything else) running
as the same user cannot read the daemon's environment or memory. The
process still reads its own ``/proc/self`` files. Children are dumpable
again after their exec (the kernel resets the flag for an ordinary exec),
which is what the orphan sweep needs to read an agent's mark.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger("salvor.hardening")
PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """Make this process non-dumpable (Linux); returns whether it now is.

    Error handling: a failed call (no libc found, a kernel that refuses)
    leaves the process as it was and is logged at debug; elsewhere than
    Linux this does nothing.
    """
    if not sys.platform.startswith("linux"):
        log.debug("not Linux: the process stays dumpable")
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    except (OSError, AttributeError) as exc:
        log.debug("the process stays dumpable: %s", exc)
        return False
    log.debug(
        "the process is not dumpable: its environment and memory are "
        "closed to its user's other processes"
    )
    return True
