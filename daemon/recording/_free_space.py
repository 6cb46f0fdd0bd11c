"""The free-space floor: new work is refused while the store's filesystem runs low.

Below the floor a daemon still records everything its running runs append (the store's own
fault healing covers a disk that then fills up), but it takes no new run, fork or
registration: those are work a caller can pile on at will, and a full disk would stop every
run at once. The floor concerns a SQLite store, whose file is on this machine; a PostgreSQL
server's disk is not visible from here and is that server's operator's to watch, so no floor
applies to it.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio
from salvor.protocol import ErrorCode
from salvor.store import sqlite_path

from ..web import OperationRefused

# The default of ``salvor serve --min-free-bytes``.
DEFAULT_MIN_FREE_BYTES = 1 << 30


def _free_bytes(directory: Path) -> int:
    """The bytes an unprivileged writer may still use on ``directory``'s filesystem."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


class FreeSpaceFloor:
    """The floor for one store: ``check`` refuses new work while free space is below it."""

    def __init__(self, store_url: str, min_free_bytes: int) -> None:
        path = sqlite_path(store_url)
        # None: no floor (PostgreSQL, or the operator turned it off with 0).
        self.directory = path.parent if path is not None and min_free_bytes > 0 else None
        self.min_free_bytes = min_free_bytes

    async def check(self, what: str) -> None:
        """Refuse ``what`` (say "a new run") while the store's filesystem is below the floor.

        The filesystem is asked on a worker thread, never on the trio thread.

        Raises:
            OperationRefused: insufficient_storage (507), naming the floor and its flag;
                nothing was recorded.
        """
        if self.directory is None:
            return
        try:
            free = await trio.to_thread.run_sync(_free_bytes, self.directory)
        except OSError:
            return  # the store's own write reports what is wrong with its directory
        if free < self.min_free_bytes:
            raise OperationRefused(
                ErrorCode.INSUFFICIENT_STORAGE,
                f"{what} is refused: the store's filesystem has {free} bytes free, below the "
                f"floor of {self.min_free_bytes} bytes new work needs (salvor serve "
                "--min-free-bytes); running runs go on, and new work is taken again once space "
                "is freed or the floor lowered",
                details={"limit": "min_free_bytes", "value": self.min_free_bytes, "free": free},
            )
