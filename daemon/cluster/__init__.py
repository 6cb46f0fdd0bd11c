"""Many nodes over one store: this node's identity and lease, the drives it owns in the store,
and the takeover of runs whose owner is gone.

Rule: imports only the packages below it (``recording`` and what it stands on); the driving set
and the runtime reach it through the callables ``serve`` hands it.
"""

from __future__ import annotations

from ._heartbeat import Peers, keep_lease, register
from ._lease import (
    DEFAULT_FENCE_MARGIN_SECONDS,
    DEFAULT_LEASE_SECONDS,
    LeaseLapsing,
    NodeLease,
)
from ._node import NodeIdentity, dead_local_peers, pid_start
from ._store_driving import StoreDriving
from ._takeover import TAKEOVER_SECONDS, Takeover

__all__ = [
    "DEFAULT_FENCE_MARGIN_SECONDS",
    "DEFAULT_LEASE_SECONDS",
    "TAKEOVER_SECONDS",
    "LeaseLapsing",
    "NodeIdentity",
    "NodeLease",
    "Peers",
    "StoreDriving",
    "Takeover",
    "dead_local_peers",
    "keep_lease",
    "pid_start",
    "register",
]
