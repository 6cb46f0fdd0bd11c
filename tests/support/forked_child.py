"""A child of the fork server (tests/support/zygote.py) made into a fresh `salvor` process.

Between ``os.fork()`` and the command, everything a new ``python -m salvor.daemon.cli ARGS``
would have differently from the server is set as that process would have it: its fds (and no
others), session, working directory, environment, signal dispositions, command line, argv,
``sys.path`` and stdio. Then it runs the module as ``-m`` does and ends as an interpreter ends.
What it cannot make fresh is said in zygote.py: what a test must keep on exec.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import io
import locale
import os
import runpy
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import NoReturn

MODULE = "salvor.daemon.cli"
_PR_SET_PDEATHSIG = 1
# What CPython does at start-up beyond the defaults: Ctrl-C raises KeyboardInterrupt, and a
# closed pipe or a too-large file is an error returned, not a signal that kills.
_PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)
_startup_path: list[str] = []


def remember_startup_path() -> None:
    """In the server: note ``sys.path`` without the entries a child's start sets itself."""
    ours = _pythonpath(os.environ)
    _startup_path[:] = sys.path[1 + len(ours) :]  # [0] is the server's cwd (-m), then PYTHONPATH


def run(request: dict, fds: list[int], server: int) -> NoReturn:
    """Become ``python -m salvor.daemon.cli`` with ``request``'s argv, and exit as it would."""
    try:
        _die_with(server)
        if request["new_session"]:
            os.setsid()
        _place_fds(fds, request["fds"])
        os.chdir(request["cwd"])
        _become_fresh(request)
    except BaseException:  # noqa: BLE001 (a child that cannot start says why and exits)
        traceback.print_exc()
        os._exit(1)
    _exit(*_run_as_main())


def _die_with(server: int) -> None:
    # A server that dies takes its children with it rather than leave them unreported.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:
        os._exit(1)  # it died before the line above: nobody would hear of this child


def _place_fds(received: list[int], targets: list[int]) -> None:
    """Put ``received[i]`` at fd ``targets[i]`` and close every other fd, as an exec would."""
    floor = max([*received, *targets]) + 1
    # First out of the way of every target, so no dup2 overwrites an fd still to be placed.
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in received]
    for fd, target in zip(moved, targets, strict=True):
        os.dup2(fd, target)
    keep = set(targets)
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own fd, closed already


def _become_fresh(request: dict) -> None:
    env = request["env"]
    os.environ.clear()  # in place: functions took `os.environ` itself as a default argument
    os.environ.update(env)
    time.tzset()
    tempfile.tempdir = None  # computed from TMPDIR on first use, as in a fresh process
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    _reset_signals(request["ignored"])
    argv = [sys.executable, "-m", MODULE, *request["argv"]]
    _rewrite_proc(argv, env)
    sys.orig_argv = argv
    sys.argv = ["-m", *request["argv"]]  # runpy puts the module's path at [0], as -m does
    sys.path[:] = [os.getcwd(), *_pythonpath(env), *_startup_path]
    _fresh_stdio(env)


def _pythonpath(env: dict) -> list[str]:
    return [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


def _reset_signals(ignored: list[int]) -> None:
    """Dispositions as an exec'd ``python`` has them: inherited ignores, then CPython's own."""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # the C library's own real-time signals
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in _PYTHON_IGNORES:
        signal.signal(signum, signal.SIG_IGN)


def _rewrite_proc(argv: list[str], env: dict) -> None:
    """Make this process's ``/proc/self/cmdline`` and ``environ`` read ``argv`` and ``env``.

    Both are the memory the kernel laid out at exec, the server's: the store names a lock's
    holder from its command line (``salvor resume``), and the orphan sweep reads environments.
    The server was started with room to spare in both; what is longer is cut short.
    """
    stat = open("/proc/self/stat").read()  # noqa: SIM115 (read whole at once)
    fields = [int(field) for field in stat[stat.rindex(")") + 2 :].split()[45:49]]
    arg_start, arg_end, env_start, env_end = fields  # /proc/<pid>/stat fields 48 to 51
    _overwrite(arg_start, arg_end, b"\0".join(os.fsencode(arg) for arg in argv))
    _overwrite(env_start, env_end, b"\0".join(os.fsencode(f"{k}={v}") for k, v in env.items()))


def _overwrite(start: int, end: int, data: bytes) -> None:
    size = end - start
    ctypes.memmove(start, data[: size - 1].ljust(size, b"\0"), size)


def _fresh_stdio(env: dict) -> None:
    encoding, _, errors = env.get("PYTHONIOENCODING", "").partition(":")
    encoding = encoding or locale.getpreferredencoding(False)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))

    def stream(fd: int, mode: str, default_errors: str) -> io.TextIOWrapper:
        writing = mode == "wb"
        raw = open(fd, mode, buffering=0 if unbuffered and writing else -1, closefd=False)  # noqa: SIM115
        return io.TextIOWrapper(
            raw,
            encoding,
            errors or default_errors,
            newline="\n",
            # stderr is line-buffered (3.9+), stdout when it is a terminal.
            line_buffering=writing and (fd == 2 or os.isatty(fd)),
            write_through=unbuffered and writing,
        )

    sys.stdin = sys.__stdin__ = stream(0, "rb", "strict")
    sys.stdout = sys.__stdout__ = stream(1, "wb", "strict")
    sys.stderr = sys.__stderr__ = stream(2, "wb", "backslashreplace")


def _run_as_main() -> tuple[int, bool]:
    """Run the module as ``-m`` does; the exit code, and whether Ctrl-C ended it."""
    try:
        # What `python -m` itself calls: __main__ becomes the module, argv[0] its path.
        runpy._run_module_as_main(MODULE)
    except SystemExit as exc:
        return _system_exit_code(exc), False
    except BaseException as exc:  # noqa: BLE001 (uncaught: printed, as the interpreter does)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return 1, isinstance(exc, KeyboardInterrupt)
    return 0, False


def _system_exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _exit(code: int, interrupted: bool) -> NoReturn:
    """End as the interpreter does: join threads, run atexit, flush stdio, then exit."""
    threading._shutdown()  # what the interpreter calls on its way out
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = 120  # CPython's status when flushing stdio at exit fails
    if interrupted:
        # An uncaught KeyboardInterrupt ends CPython by SIGINT, so its parent sees -2.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)
