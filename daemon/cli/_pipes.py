"""Standard output and error whose reader may leave: ``salvor log RUN | head -1``.

A reader that closes the pipe has taken what it wanted; that is not the command's failure. From
the first write the closed pipe refuses, what the command would still write there goes to
``/dev/null``, and the command carries on to its own end and exit status (``salvor run AGENT |
head -1`` still drives the run it started). No traceback, nothing on stderr.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class _ReaderMayLeave:
    """A text stream that discards what is written to it once its pipe's reader has gone."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._discard()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard()

    def _discard(self) -> None:
        # The descriptor itself is pointed at /dev/null, so the buffered text the failed write
        # left behind (and the interpreter's flush at exit) goes there too, not to a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def readers_may_leave() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` discard what their closed pipe refuses, for the block;
    both are flushed at its end, so nothing is left for the interpreter's exit to fail on."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ReaderMayLeave(sys.stdout), _ReaderMayLeave(sys.stderr)
    try:
        yield
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            sys.stdout, sys.stderr = saved
