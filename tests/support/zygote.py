"""The fork server: an interpreter that has imported salvor, forking the suite's `salvor` processes.

Why: the suite is CPU-bound, and it starts some 300 `salvor` processes (serve, run, resume,
doctor, ...) that each spend ~0.8 s of CPU importing the package before doing anything (SQLAlchemy
alone is a quarter of a second): some 250 s of CPU on CI's two cores. A child forked from this
server starts with those imports done. It is still a real process: a pid of its own, its own
stdin/stdout/stderr, environment, working directory and session, killed with real signals, and it
runs the same ``salvor.daemon.cli`` ``__main__`` the console script's ``python -m`` runs.

What a test must keep on exec (``tests/support/spawn.py`` does either): anything about the process
itself rather than the command: the console script or the interpreter's start (its cost, its
flags), ``/proc/<pid>/cmdline`` beyond the argv (the forked child's is rewritten to read as
``python -m salvor.daemon.cli ARGS``, as the store's lock refusals read it, and its
``/proc/<pid>/environ`` to read its environment, for the orphan sweep), its parent pid (the
server's here, the test's there), ``PYTHONHASHSEED`` (every child shares the server's hash seed)
or anything else the interpreter reads from the environment at start-up (``PYTHONWARNINGS``, the
locale, ``-X`` options).

The protocol, one SOCK_SEQPACKET connection per child (messages keep their bounds):

* the client sends one JSON request, ``{argv, env, cwd, new_session, fds, ignored}``, carrying
  as SCM_RIGHTS the fds to place at the numbers in ``fds`` (0, 1, 2 and any pass_fds);
* the server answers ``{"pid": N}`` once forked, then ``{"status": S}`` (the raw wait status,
  which ``subprocess`` turns into a returncode) when the child is reaped, and closes it.

The server stays single-threaded (a fork copies only the forking thread), never runs trio, opens
no store and creates no engine. It runs until its stdin (a pipe from the pytest process that
started it) reaches EOF; its children die with it (``PR_SET_PDEATHSIG``), so a client whose server
vanished reads EOF and reports its child SIGKILLed, which it was.

Run as ``python -m tests.support.zygote SOCKET_PATH [ROOM]``; the ROOM argument (and a
``ZYGOTE_ROOM`` variable) only reserve memory for the children's rewritten command lines and
environments.
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import threading

from tests.support import forked_child

# What a `serve` and a `run` import (from `-X importtime` of each): the command line, the
# daemon's HTTP side that `serve` imports when it starts, and what the model gateway's first
# call imports (httpx's transport, anyio; stringprep for an IDNA host name).
PRELOAD = (
    "salvor.daemon.cli",
    "salvor.daemon.serve",
    "salvor.daemon.api",
    "salvor.daemon.web._listener",
    "salvor.daemon.notify",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
    "httpx",
    "httpcore",
    "sqlite3",
    "certifi",
    "wsproto",
    "prometheus_client.core",
    "anyio",
    "stringprep",
)
MAX_FDS = 64
REQUEST_BYTES = 1 << 20  # an environment and an argv, in one message


class Server:
    """Accepts fork requests, forks, and reports each child's wait status on its connection."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, self._accept)
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, self._stdin)
        self.children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (connection, pidfd)
        self.running = True

    def serve(self) -> None:
        while self.running:
            for key, _ in self.selector.select():
                key.data()

    def _stdin(self) -> None:
        if not os.read(sys.stdin.fileno(), 4096):
            self.running = False  # the pytest process closed it, or died

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        try:
            request, fds = _receive(connection)
        except (OSError, ValueError) as exc:
            print(f"zygote: a bad request ({exc!r}), dropped", file=sys.stderr, flush=True)
            connection.close()
            return
        try:
            pid = self._fork(connection, request, fds)
        finally:
            for fd in fds:
                os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = connection, pidfd
        self.selector.register(pidfd, selectors.EVENT_READ, functools.partial(self._reap, pid))
        _send(connection, {"pid": pid})

    def _fork(self, connection: socket.socket, request: dict, fds: list[int]) -> int:
        # A fork copies only the calling thread; with another one alive the child could inherit a
        # lock that thread held, never to be released.
        assert threading.active_count() == 1, threading.enumerate()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                connection.close()
                self._forget()
            finally:
                forked_child.run(request, fds, server)  # never returns
        return pid

    def _forget(self) -> None:
        """In a child: close what is the server's, before the child's fds are placed."""
        self.selector.close()
        self.listener.close()
        for connection, pidfd in self.children.values():
            connection.close()
            os.close(pidfd)

    def _reap(self, pid: int) -> None:
        connection, pidfd = self.children.pop(pid)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        _send(connection, {"status": status})
        connection.close()


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    # A client sends its request as soon as it connects; one that does not is not waited for.
    connection.settimeout(10)
    message, fds, flags, _ = socket.recv_fds(connection, REQUEST_BYTES, MAX_FDS)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ValueError("the request or its fds did not fit")
    request = json.loads(message)
    if len(request["fds"]) != len(fds):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"{len(fds)} fds came for {request['fds']}")
    return request, fds


def _send(connection: socket.socket, message: dict) -> None:
    try:
        connection.send(json.dumps(message).encode())
    except OSError:
        pass  # the client went away early: its child runs on, and is reaped all the same


def main(argv: list[str]) -> None:
    path = argv[1]
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an optional dependency not installed here: the child goes without, as exec'd
    forked_child.remember_startup_path()
    # Ctrl-C in a terminal reaches the whole process group; the children take it as a fresh
    # `python` would, and the server lives until the pytest process closes its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # What is imported now lives as long as any child: kept out of their collections, so a child's
    # collector neither scans nor copies (by touching refcounts) the server's pages.
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    Server(listener).serve()


if __name__ == "__main__":
    main(sys.argv)
