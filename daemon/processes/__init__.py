"""Child processes and this process: spawning, tethering children to the daemon, the environment
allow-list, hardening, orphan marks, loopback port claims, the kill-test fault hooks.

Rule: knows processes, not runs. Imports nothing else from the daemon.
"""

from __future__ import annotations

from ._child_env import (
    child_environment,
)
from ._faults import (
    kill_after_commit_hook,
    kill_if_requested,
)
from ._hardening import (
    make_undumpable,
)
from ._orphans import (
    MARK_VAR,
    OWNER_VAR,
    RUN_VAR,
    kill_group,
    owner_mark,
    pid_start,
    store_fingerprint,
    sweep_orphans,
)
from ._port_claims import (
    PortClaims,
)
from ._spawn import (
    open_tied_process,
)

__all__ = [
    "MARK_VAR",
    "OWNER_VAR",
    "RUN_VAR",
    "PortClaims",
    "child_environment",
    "kill_after_commit_hook",
    "kill_group",
    "kill_if_requested",
    "make_undumpable",
    "open_tied_process",
    "owner_mark",
    "pid_start",
    "store_fingerprint",
    "sweep_orphans",
]
