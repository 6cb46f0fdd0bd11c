"""The `salvor` command line run inside the test's own process.

For a test that reads what a command answers (a refusal's sentence and exit status, the output
of a read such as ``history`` or ``replay --dry-run``), not what becomes of a process: the same
``main(argv)`` the console script calls, with the environment the test names, its stdout and
stderr captured. A subprocess costs a second of CPU in imports alone; this costs the command.

A test that kills the process, sends it a signal, reads a terminal, or needs the command to own
a store lock beside another process of its own starts a real process instead, through
``tests/support/spawn`` (forked from an interpreter that has imported the package, or exec'd).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from unittest import mock

from salvor.daemon import cli
from salvor.daemon.cli import _main


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _warnings_to(stream: io.StringIO) -> Iterator[None]:
    # A process with no logging set up prints a warning on stderr (logging.lastResort), where a
    # test counting the lines of a refusal sees it; pytest's own handlers would swallow it here.
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


def salvor_in_process(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """``salvor ARGS`` as a finished process would report it: exit status, stdout, stderr.

    ``env`` replaces the environment for the command and ``cwd`` the working directory (the
    test's own come back after); a usage error's exit 2 is caught from argparse as a process's
    status would be. A fault variable in ``env`` is refused: it would kill the test runner.

    Raises:
        AssertionError: the command did not return within ``timeout`` seconds (it runs on a
            thread of its own, as a subprocess would run under ``subprocess.run(timeout=)``,
            so a command that should have been refused and drives instead fails the test
            rather than holding it; the thread is left to the interpreter's exit).
    """
    env = dict(os.environ if env is None else env)
    faults = sorted(name for name in env if name.startswith("SALVOR_FAULT_"))
    if faults:
        raise ValueError(f"{faults} kill the process they are set in: spawn the command")
    stdout, stderr = io.StringIO(), io.StringIO()
    with (
        _environment(env),
        contextlib.chdir(cwd or os.getcwd()),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
        _warnings_to(stderr),
        # The command makes its process undumpable before it reads a secret; this process is the
        # test runner's, which must stay as it was.
        mock.patch.object(_main, "make_undumpable", lambda: False),
    ):
        code = _main_on_a_thread(list(args), timeout)
    return subprocess.CompletedProcess(
        ["salvor", *args], code, stdout.getvalue(), stderr.getvalue()
    )


def _main_on_a_thread(argv: list[str], timeout: float) -> int:
    outcome: list[int | BaseException] = []

    def command() -> None:
        try:
            outcome.append(cli.main(argv))
        except SystemExit as exc:
            outcome.append(exc.code if isinstance(exc.code, int) else 1)
        except BaseException as exc:  # noqa: BLE001 (handed to the test's thread, raised there)
            outcome.append(exc)

    thread = threading.Thread(target=command, name=f"salvor {argv[0]}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"`salvor {' '.join(argv)}` did not return within {timeout:g} s")
    (result,) = outcome
    if isinstance(result, BaseException):
        raise result
    return result
