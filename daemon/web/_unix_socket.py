"""A Unix socket the daemon listens on (``--listen unix:PATH``): only its own user can connect.

The file permissions are the whole access check (no token is needed on it), so the socket is
claimed with care, blocking (run it off the trio thread):

* Its directory must be one other users cannot swap the socket out of: owned by this user (or
  root) and writable by no one else, unless it is sticky (``/tmp``), where nobody else may
  rename or remove what is ours.
* A lock file beside it (``PATH.lock``, flock, released by the kernel when its holder dies) says
  whether a live salvor listens there: a live daemon's socket is never removed. With the lock
  taken, a socket this user left at the path is removed when nothing answers on it (a daemon
  that was killed); one that answers belongs to some other program and is left alone, as is
  anything at the path that is not this user's socket.
* The socket is made 0600 between ``bind`` and ``listen``: until ``listen`` nobody can connect,
  so there is no moment it is open to other users (no process-wide umask is touched).

On a clean stop the socket file is removed (if it is still the one this daemon made); the lock
file stays, empty, so no two daemons can ever both believe they hold it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
from pathlib import Path

# sun_path holds 108 bytes on Linux, the terminating NUL among them.
MAX_PATH_BYTES = 107
SOCKET_MODE = 0o600


class UnixSocketRefused(Exception):
    """The socket cannot be claimed at that path; the message is one sentence saying why and
    what to do. Nothing was created or removed."""


class UnixSocket:
    """A claimed, bound (not yet listening) Unix socket at ``path``, and the lock that makes it
    this daemon's."""

    def __init__(self, path: str, lock_fd: int, sock: socket.socket) -> None:
        self.path = path
        self._lock_fd = lock_fd
        self._inode = os.stat(path).st_ino
        self._socket: socket.socket | None = sock

    def bind_spec(self) -> str:
        """hypercorn's bind for the socket (``fd://N``); the listener owns the descriptor from
        then on."""
        sock, self._socket = self._socket, None
        if sock is None:
            raise RuntimeError("the socket was handed over already")
        return f"fd://{sock.detach()}"

    def listening(self, backlog: int) -> int:
        """Listen now, and the socket's descriptor (still this object's: ``release`` closes it),
        for processes that inherit it (``salvor serve --workers``)."""
        if self._socket is None:
            raise RuntimeError("the socket was handed over already")
        self._socket.listen(backlog)
        return self._socket.fileno()

    def release(self) -> None:
        """Remove the socket file (when it is still ours) and let the lock go. Blocking."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        with contextlib.suppress(OSError):
            if os.lstat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def claim_unix_socket(path: str) -> UnixSocket:
    """Claim and bind the socket at ``path`` (absolute), mode 0600, not yet listening. Blocking.

    Raises:
        UnixSocketRefused: the directory is unsafe or missing, another daemon or program listens
            there, or something else is in the way; nothing was created or removed, and no lock
            is held.
    """
    _check_directory(Path(path).parent)
    lock_fd = _take_lock(path)
    try:
        _clear_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            # Before listen(): nobody can connect yet, so the looser mode bind gave it is never
            # usable by anyone.
            os.chmod(path, SOCKET_MODE)
        except OSError as exc:
            sock.close()
            raise UnixSocketRefused(
                f"cannot listen on the Unix socket {path} ({exc.strerror or exc}); "
                "pick another path with --listen unix:PATH"
            ) from None
        return UnixSocket(path, lock_fd, sock)
    except BaseException:
        os.close(lock_fd)
        raise


def _check_directory(directory: Path) -> None:
    try:
        info = directory.stat()
    except OSError as exc:
        raise UnixSocketRefused(
            f"no directory {directory} for the Unix socket ({exc.strerror or exc}); create it "
            "(mode 0700) or pick another path, e.g. --listen unix:$XDG_RUNTIME_DIR/salvor.sock"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise UnixSocketRefused(f"{directory} is not a directory; pick another Unix socket path")
    if info.st_uid not in (os.geteuid(), 0):
        raise UnixSocketRefused(
            f"the directory {directory} belongs to another user, who could replace the socket; "
            "put it in a directory of your own, e.g. --listen unix:$XDG_RUNTIME_DIR/salvor.sock"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise UnixSocketRefused(
            f"the directory {directory} is writable by other users, who could replace the "
            "socket; put it in a directory only you can write, e.g. "
            "--listen unix:$XDG_RUNTIME_DIR/salvor.sock"
        )


def _take_lock(path: str) -> int:
    lock_path = path + ".lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise UnixSocketRefused(
            f"cannot open the socket's lock file {lock_path} ({exc.strerror or exc}); "
            "pick another path with --listen unix:PATH"
        ) from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise UnixSocketRefused(
                f"the socket's lock file {lock_path} belongs to another user; "
                "pick another path with --listen unix:PATH"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UnixSocketRefused(
                f"another salvor serve listens on the Unix socket {path}; stop it, or pick "
                "another path with --listen unix:PATH"
            ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _clear_stale(path: str) -> None:
    """Remove a socket this user left at ``path`` that nothing answers on."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
        raise UnixSocketRefused(
            f"{path} exists and is not a socket a salvor of this user left there; remove it "
            "yourself, or pick another path with --listen unix:PATH"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError as exc:
        if exc.errno != errno.ECONNREFUSED:
            raise UnixSocketRefused(
                f"cannot tell whether something listens on {path} ({exc.strerror or exc}); "
                "pick another path with --listen unix:PATH"
            ) from None
    else:
        raise UnixSocketRefused(
            f"another program listens on the Unix socket {path}; stop it, or pick another path "
            "with --listen unix:PATH"
        )
    finally:
        probe.close()
    # Nothing listens: a daemon that held it died without removing it.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
