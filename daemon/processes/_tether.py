"""Start a command that dies with the process that started it: ``python -I -S
_tether.py ERRFD -- COMMAND...``.

The tether runs between the fork and the command's exec. It forks a small
watcher and then exec's COMMAND in its own place (same pid, same process
group, same stdio), so the daemon waits on, signals and reads the command
exactly as if it had started it directly. The watcher holds a pidfd of the
daemon and one of the command; when the daemon's process is gone (SIGKILL
included) it SIGKILLs the process group it shares with the command, and
when the command ends first it just exits.

Why not ``prctl(PR_SET_PDEATHSIG)``: the kernel sends that signal when the
*thread* that forked the child exits, not the process, and trio forks from
a cached worker thread (``trio.lowlevel.open_process`` runs ``Popen`` through
``trio.to_thread``) that exits after ten idle seconds, which would kill every
agent ten seconds after it started. A pidfd of the daemon process has no
such trap. Why not a ``preexec_fn``: Python code between fork and exec in a
process with threads (the store's) can deadlock on a lock another thread
held at the fork.

Exec failure: ERRFD is the write end of a close-on-exec pipe the daemon
holds the other end of; a successful exec closes it, a failed one writes the
errno there first (``_spawn`` raises it as the ``OSError`` a direct start
would have raised). Without pidfds (Linux before 5.3) the command is exec'd
untethered, and the start-up orphan sweep is what remains.

Standard library only and nothing from salvor, run with ``-I -S``, so the
extra interpreter costs a few milliseconds per start (no site, no salvor).
"""

from __future__ import annotations

import os
import select
import signal
import sys


def _watch(daemon: int, command: int) -> None:
    """In the watcher: wait for the daemon or the command to end; a daemon
    gone takes the group with it."""
    # Hold none of the command's pipes: the daemon reads them to their end.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = {0, 1, 2, daemon, command}
    for fd in os.listdir("/proc/self/fd"):
        if int(fd) not in keep:
            try:
                os.close(int(fd))
            except OSError:
                pass
    poller = select.poll()
    poller.register(daemon, select.POLLIN)
    poller.register(command, select.POLLIN)
    while True:
        try:
            ready = {fd for fd, _ in poller.poll()}
        except InterruptedError:
            continue
        break
    if daemon in ready:
        os.killpg(0, signal.SIGKILL)  # the command's group, this watcher included
    os._exit(0)


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: python -I -S _tether.py ERRFD -- COMMAND...\n")
        os._exit(2)
    errfd, command = int(argv[1]), argv[3:]
    daemon = os.getppid()
    watched = False
    try:
        daemon_fd = os.pidfd_open(daemon)
        command_fd = os.pidfd_open(os.getpid())
        watched = True
    except (AttributeError, OSError):
        pass  # no pidfds here: run untethered (the orphan sweep still finds it)
    if os.getppid() != daemon:
        os._exit(1)  # the daemon died before its pidfd was taken: start nothing
    if watched:
        # Fork twice, so the watcher is nobody's child the command might wait on.
        middle = os.fork()
        if middle == 0:
            if os.fork() == 0:
                try:
                    _watch(daemon_fd, command_fd)
                finally:
                    os._exit(0)
            os._exit(0)
        try:
            os.waitpid(middle, 0)
        except ChildProcessError:
            pass  # SIGCHLD ignored (a disposition an exec keeps): the kernel reaped it already
        os.close(daemon_fd)
        os.close(command_fd)
    os.set_inheritable(errfd, False)  # the exec closes it: that is the daemon's "started"
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        os.write(errfd, str(exc.errno or 0).encode())
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv)
