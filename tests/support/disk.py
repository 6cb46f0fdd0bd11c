"""A small filesystem of a test's own, and a filler that takes its last byte.

A real store on a tmpfs mounted for the test, filled by a file that takes every free byte and
freed by deleting it: the store faults a full disk makes, without touching the machine's disks.
Mounting needs root; elsewhere the caller is told why in one line (``TmpfsRefused``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


class TmpfsRefused(Exception):
    """This process may not mount a tmpfs here; the message says why."""


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: ``16m``) at ``mount``, unmounted on the way out
    (lazily: a daemon killed a moment ago may still hold a file open)."""
    if os.geteuid() != 0:
        raise TmpfsRefused(
            "mounting a small tmpfs needs root (run as root, or in a container with CAP_SYS_ADMIN)"
        )
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise TmpfsRefused(
            f"this machine cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}"
        )
    try:
        yield mount
    finally:
        subprocess.run(["chattr", "-R", "-i", str(mount)], capture_output=True, check=False)
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the filesystem under it has no byte left."""
    chunk = b"\0" * (1 << 16)
    with open(path, "ab", buffering=0) as filler:
        while True:
            try:
                filler.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    # What a 64 KiB chunk could not take, byte pages can.
    with open(path, "ab", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 512)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


class Filler:
    """Fills the filesystem under ``directory`` (``begin``) and frees it again (``end``)."""

    name = "full disk"

    def __init__(self, directory: Path) -> None:
        self.store_dir = directory
        self.filler = directory / "filler"

    def begin(self) -> None:
        fill(self.filler)

    def end(self) -> None:
        self.filler.unlink(missing_ok=True)
