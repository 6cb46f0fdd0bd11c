"""This node: who it is in the store, and which of its peers on this machine are proven dead.

A node is one ``salvor serve`` process. Its id is made at start and never reused
(``<name>:<pid>:<6 hex>``), so a restarted daemon is a new node and the runs its previous life
owned are a dead node's, taken over at once. The name is the operator's (``--node-name``), the
host name by default.

A peer on another machine is dead only once its lease has expired in the store: nothing else
can tell a partitioned node from a dead one. A peer on this machine (the same kernel boot) is
proven dead sooner, by the kernel: its pid is gone, or it now names a process that started at
another instant (a recycled pid). Taking such a peer's runs at once keeps the restart of a
single daemon as fast as it was before nodes had leases.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..processes import pid_start

_PROC = Path("/proc")
_BOOT_ID = _PROC / "sys" / "kernel" / "random" / "boot_id"


def boot_id() -> str:
    """This kernel boot's id (Linux), or "" when it cannot be read (no peer is then provably
    on this machine, so none is ever proven dead: they wait for their leases)."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """This node as its row in the store names it."""

    node_id: str
    name: str
    host: str
    pid: int
    pid_start: str
    boot_id: str

    @classmethod
    def here(cls, name: str | None = None) -> NodeIdentity:
        """A new identity for this process, named ``name`` (the host name when None)."""
        host = socket.gethostname()
        name = name or host or "salvor"
        pid = os.getpid()
        return cls(
            node_id=f"{name}:{pid}:{secrets.token_hex(3)}",
            name=name,
            host=host,
            pid=pid,
            pid_start=pid_start(pid) or "",
            boot_id=boot_id(),
        )


def successor(node: NodeIdentity) -> NodeIdentity:
    """A new identity for this same process (ids are never reused): the node registers under it
    after the store said its lease had lapsed, and its earlier id stays dead for good."""
    name = node.name
    return NodeIdentity(
        node_id=f"{name}:{node.pid}:{secrets.token_hex(3)}",
        name=name,
        host=node.host,
        pid=node.pid,
        pid_start=node.pid_start,
        boot_id=node.boot_id,
    )


def dead_local_peers(me: NodeIdentity, peers: Iterable[object]) -> tuple[str, ...]:
    """The ids of the nodes among ``peers`` (``NodeRecord``s) proven dead by this machine's kernel:
    on this boot, and their pid gone or started at another instant than when they registered.

    A peer this process cannot judge (another boot, no boot id, no recorded start) is left to its
    lease.
    """
    if not me.boot_id:
        return ()
    dead = []
    for peer in peers:
        if peer.node_id == me.node_id or peer.boot_id != me.boot_id or not peer.pid_start:
            continue
        if pid_start(peer.pid) != str(peer.pid_start):
            dead.append(peer.node_id)
    return tuple(dead)
