"""Start a real `salvor` process for a test: forked from the fork server, or exec'd.

What tests call instead of ``[sys.executable, "-m", "salvor.daemon.cli", ...]``: a real process
with a pid of its own, killed with real signals, which skips only the ~0.8 s of CPU a new
interpreter spends importing the package (tests/support/zygote.py says why that matters and what
a test must keep on exec). Each pytest process (each xdist worker) starts its own server on first
use and stops it at exit.

* ``salvor_process(args, ...)``: a ``subprocess.Popen`` (a subclass whose child is forked);
* ``run_salvor(args, ...)``: as ``subprocess.run``, a ``CompletedProcess``;
* ``open_salvor_process(args, ...)``: as ``trio.lowlevel.open_process``, for trio tests.

``SALVOR_TEST_SPAWN=exec`` makes each of them a plain exec of ``python -m salvor.daemon.cli``
(returning what Popen and trio return), so a test can be checked both ways; so does a server that
could not start.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

SPAWN_ENV = "SALVOR_TEST_SPAWN"
# ``salvor serve`` serves with one process per core by default: a supervisor and its workers, each
# a node over the store. A test of one daemon's behaviour, not of --workers, adds these arguments
# and serves with one process: a third of the interpreters to start, and the process the test
# SIGKILLs or SIGSTOPs is the one that drives its runs. The README's commands as printed, CI's
# first command, and the tests of --workers, of the systemd unit and of the README's walkthroughs
# serve with the default.
ONE_PROCESS = ("--workers", "1")
CLI = (sys.executable, "-m", "salvor.daemon.cli")
REPO = Path(__file__).resolve().parents[2]
# Room in the server's argv and environment memory for a child's (forked_child._rewrite_proc).
_ROOM = "-" * 32768
_SIGKILLED = signal.SIGKILL  # the raw wait status of a process SIGKILLed


class _Zygote:
    """This process's fork server: started, asked to fork, stopped at exit."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="salvor-zygote-")
        self.path = os.path.join(self.directory, "socket")
        with open(os.path.join(self.directory, "server.log"), "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.zygote", self.path, _ROOM],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=REPO,
                env={**_server_environment(), "ZYGOTE_ROOM": _ROOM * 2},
            )
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        if not ready or self.process.stdout.readline() != b"ready\n":
            log = Path(self.directory, "server.log").read_text(errors="replace")[-2000:]
            self.close()  # the directory, its log with it, goes
            raise RuntimeError(f"the fork server did not start:\n{log}")

    def fork(self, request: dict, fds: list[int]) -> tuple[socket.socket, int]:
        """Ask for a child; its connection (the exit status comes on it) and pid."""
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(self.path)
            socket.send_fds(connection, [json.dumps(request).encode()], fds)
            answer = connection.recv(4096)
            if not answer:
                raise RuntimeError(f"the fork server refused; see {self.directory}/server.log")
            return connection, json.loads(answer)["pid"]
        except BaseException:
            connection.close()
            raise

    def close(self) -> None:
        self.process.stdin.close()  # its cue to exit (its children die with it)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def _server_environment() -> dict[str, str]:
    # None of salvor's own variables: what the package reads of them is read at call time, in a
    # child, and the orphan sweep must never take the server for a salvor's agent.
    return {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}


_zygote: _Zygote | None = None
_unavailable = False
_lock = threading.Lock()


def _server() -> _Zygote | None:
    """The fork server, started on first use; None when exec is asked for or it cannot start."""
    global _zygote, _unavailable
    if os.environ.get(SPAWN_ENV) == "exec":
        return None
    with _lock:
        if _zygote is not None and _zygote.process.poll() is not None:
            atexit.unregister(_zygote.close)
            _zygote.close()
            _zygote = None  # it died (its children with it): the next child gets a new one
        if _zygote is None and not _unavailable:
            try:
                _zygote = _Zygote()
            except (OSError, RuntimeError) as exc:
                _unavailable = True
                print(f"spawn: exec'ing salvor processes instead ({exc})", file=sys.stderr)
            else:
                atexit.register(_zygote.close)
        return _zygote


def _ignored_signals() -> list[int]:
    # An exec'd child inherits what this process ignores, except what Popen's restore_signals
    # resets (and CPython ignores again itself).
    return [
        int(signum)
        for signum in signal.valid_signals()
        if signum not in (signal.SIGPIPE, signal.SIGXFSZ)
        and signal.getsignal(signum) == signal.SIG_IGN
    ]


def _wait_until_gone(pid: int) -> None:
    try:
        pidfd = os.pidfd_open(pid)  # of a process not ours: readable once it has exited
    except ProcessLookupError:
        return
    try:
        select.select([pidfd], [], [], 10)  # a SIGKILL on its way: a bound for safety only
    finally:
        os.close(pidfd)


class ForkedPopen(subprocess.Popen):
    """A ``subprocess.Popen`` whose child the fork server forked.

    Popen's own ``__init__`` sorts out stdin/stdout/stderr (PIPE, DEVNULL, STDOUT, a file, an fd)
    and text mode; only starting the child and waiting for it differ: the child's exit status
    comes on the server's connection, not from ``waitpid`` (it is the server's child).
    """

    def __init__(self, zygote: _Zygote, args: Sequence[str], **options: Any) -> None:
        self._zygote = zygote
        self._connection: socket.socket | None = None
        super().__init__([*CLI, *args], **options)

    def _execute_child(  # Popen's signature
        self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
        creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
        restore_signals, gid, gids, uid, umask, start_new_session, process_group,
    ) -> None:  # fmt: skip
        try:
            if cwd is not None and not os.path.isdir(cwd):
                raise FileNotFoundError(2, "No such file or directory", os.fspath(cwd))
            targets = [0, 1, 2, *pass_fds]
            # -1: the child inherits this process's own fd, as an exec'd one would.
            fds = [fd if fd != -1 else n for n, fd in enumerate((p2cread, c2pwrite, errwrite))]
            request = {
                "argv": list(args[len(CLI) :]),
                "env": {os.fsdecode(k): os.fsdecode(v) for k, v in (env or os.environ).items()},
                "cwd": os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd()),
                "new_session": bool(start_new_session),
                "fds": targets,
                "ignored": _ignored_signals(),
            }
            self._connection, self.pid = self._zygote.fork(request, [*fds, *pass_fds])
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        """``waitpid``'s answer, from the server: (pid, status), or (0, 0) while it runs."""
        if self._connection is None:
            return self.pid, 0  # reported already
        try:
            flags = socket.MSG_DONTWAIT if wait_flags & os.WNOHANG else 0
            message = self._connection.recv(4096, flags)
        except BlockingIOError:
            return 0, 0
        if message:
            status = json.loads(message)["status"]
        else:  # EOF: the server died, and takes the child with it (PR_SET_PDEATHSIG)
            _wait_until_gone(self.pid)
            status = _SIGKILLED
        self._connection.close()
        self._connection = None
        return self.pid, status

    def _internal_poll(self, _deadstate=None, **_: Any) -> int | None:
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            finally:
                self._waitpid_lock.release()
        return self.returncode

    def fileno(self) -> int:
        """The connection the exit status comes on (readable once it has), for a trio wait."""
        return self._connection.fileno() if self._connection is not None else -1


@contextlib.contextmanager
def sigint_as_a_terminal_gives_it() -> Iterator[None]:
    """Start children with SIGINT at its default, as a shell gives its foreground job.

    A process of a background job (``pytest &``, or a non-interactive shell's ``&``) inherits
    SIGINT ignored and passes that on to every child, exec'd or forked, and such a child never
    hears Ctrl-C. A test of what Ctrl-C does starts its child inside this block; it runs on the
    main thread (``signal.signal``'s rule) and leaves this process's own disposition as it was.
    """
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def salvor_process(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    start_new_session: bool = False,
    pass_fds: Sequence[int] = (),
    **text_options: Any,
) -> subprocess.Popen:
    """``salvor ARGS`` in a process of its own, as ``subprocess.Popen([python, -m, ...])``.

    ``text_options`` are Popen's ``text``, ``encoding``, ``errors`` and ``bufsize``.
    """
    options = dict(
        env=env,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=start_new_session,
        pass_fds=pass_fds,
        **text_options,
    )
    zygote = _server()
    if zygote is None:
        return subprocess.Popen([*CLI, *args], **options)
    return ForkedPopen(zygote, args, **options)


def run_salvor(
    args: Sequence[str],
    *,
    input: str | bytes | None = None,  # subprocess.run's name
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **options: Any,
) -> subprocess.CompletedProcess:
    """``salvor ARGS`` run to its end, as ``subprocess.run`` runs it."""
    if capture_output:
        options["stdout"] = options["stderr"] = subprocess.PIPE
    if input is not None:
        options["stdin"] = subprocess.PIPE
    with salvor_process(args, **options) as process:
        try:
            out, err = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()  # not communicate: an agent the command started may hold its pipes
            raise
        except BaseException:
            process.kill()
            raise
        code = process.poll()
    if check and code:
        raise subprocess.CalledProcessError(code, process.args, out, err)
    return subprocess.CompletedProcess(process.args, code, out, err)


class ForkedTrioProcess:
    """What the suite's trio tests use of a ``trio.Process``, for a forked child."""

    def __init__(self, popen: ForkedPopen, streams: dict[str, trio.lowlevel.FdStream]) -> None:
        self._popen = popen
        self._wait_lock = trio.Lock()  # one task at a time waits on the connection
        self.args, self.pid = popen.args, popen.pid
        self.stdin: trio.abc.SendStream | None = streams.get("stdin")
        self.stdout: trio.abc.ReceiveStream | None = streams.get("stdout")
        self.stderr: trio.abc.ReceiveStream | None = streams.get("stderr")

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def poll(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        """Wait for the child's exit without blocking the trio thread; its returncode."""
        async with self._wait_lock:
            while self._popen.poll() is None:
                await trio.lowlevel.wait_readable(self._popen)
        return self._popen.returncode

    def send_signal(self, sig: int) -> None:
        self._popen.send_signal(sig)

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    async def aclose(self) -> None:
        """As ``trio.Process.aclose``: close the pipes, wait, and kill the child if cancelled."""
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                await stream.aclose()
        try:
            await self.wait()
        finally:
            if self._popen.poll() is None:
                self.kill()
                with trio.CancelScope(shield=True):
                    await self.wait()


async def open_salvor_process(
    args: Sequence[str], *, stdin: Any = None, stdout: Any = None, stderr: Any = None, **options
) -> ForkedTrioProcess | trio.Process:
    """``salvor ARGS`` in a process of its own, as ``trio.lowlevel.open_process`` starts one.

    ``options`` are ``salvor_process``'s (env, cwd, start_new_session, pass_fds). A PIPE is a
    trio stream, as trio makes it.
    """
    zygote = await trio.to_thread.run_sync(_server)
    if zygote is None:
        return await trio.lowlevel.open_process(
            [*CLI, *args], stdin=stdin, stdout=stdout, stderr=stderr, **options
        )
    how = {"stdin": stdin, "stdout": stdout, "stderr": stderr}
    streams, child_ends = {}, {}
    for name in [name for name, value in how.items() if value == subprocess.PIPE]:
        read, write = os.pipe()
        parent, child_ends[name] = (write, read) if name == "stdin" else (read, write)
        streams[name] = trio.lowlevel.FdStream(parent)
    start = functools.partial(ForkedPopen, zygote, args, **{**how, **child_ends}, **options)
    try:
        popen = await trio.to_thread.run_sync(start)
    except BaseException:
        for stream in streams.values():
            stream.close()
        raise
    finally:
        for fd in child_ends.values():
            os.close(fd)
    return ForkedTrioProcess(popen, streams)
