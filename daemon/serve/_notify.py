"""systemd's notify protocol: READY=1, STOPPING=1, WATCHDOG=1 as datagrams to NOTIFY_SOCKET.

Plain socket writes, no dependency. Outside systemd (no NOTIFY_SOCKET) every
call does nothing.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, environ=os.environ) -> None:
        address = environ.get("NOTIFY_SOCKET")
        if address and address.startswith("@"):
            address = "\0" + address[1:]  # an abstract socket
        self._address = address or None
        watchdog_usec = environ.get("WATCHDOG_USEC")
        # Ping at half the interval systemd allows, as sd_watchdog_enabled advises.
        self.watchdog_interval = (
            int(watchdog_usec) / 2_000_000 if watchdog_usec and watchdog_usec.isdigit() else None
        )

    def send(self, message: str) -> None:
        if self._address is None:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            # Never blocking: this runs on the trio thread, and a systemd that
            # stopped reading must not stall the daemon (a lost ping is an OSError here).
            sock.setblocking(False)
            try:
                sock.connect(self._address)
                sock.sendall(message.encode())
            except OSError:
                pass  # systemd went away; nothing to tell
