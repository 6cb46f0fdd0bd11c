"""Loopback ports for the servers the tests start, and restart on the same port."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range.

    A daemon a test restarts listens on the same port in each life, and between lives the port is
    free. A port from the ephemeral range (what binding port 0 gives) can be handed in that
    window to another test's process, as a listener's port 0 or as an outgoing connection's
    source port (a PostgreSQL client's), and the restart then cannot listen. Below that range the
    kernel hands out nothing by itself; only another test's random pick could meet this one, and
    the pick is checked by binding it.
    """
    low = _ephemeral_low()
    first = 10000 if low > 11000 else 1024
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(first, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port between {first} and {low}")
