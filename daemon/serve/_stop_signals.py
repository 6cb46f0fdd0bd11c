"""How a serving daemon hears that it must stop: SIGTERM or SIGINT, or (a worker) its
supervisor gone."""

from __future__ import annotations

import logging
import os
import signal

import trio

log = logging.getLogger("salvor.serve")


class HeldSignals:
    """A worker's SIGTERM and SIGINT outside the signal watcher: noted, never fatal.

    A worker may hear one stop twice (systemd signals every process of the unit, a terminal its
    whole process group, and the supervisor forwards its own): the second, arriving after the
    watcher let go of the signals, would otherwise kill the process as it exits. One that
    arrives before the watcher runs is noted, and the watcher stops at once.
    """

    received = False

    @classmethod
    def hold(cls) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, cls._note)

    @classmethod
    def _note(cls, signum, frame) -> None:
        cls.received = True


async def watch_signals(stop: trio.Event, keep_receiving: bool = False) -> None:
    """Set ``stop`` at the first SIGTERM or SIGINT. ``keep_receiving`` (a worker): hold the
    signals until the end, so a second copy of the stop does not cut it half-way."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        if keep_receiving and HeldSignals.received:
            stop.set()
        async for _ in signals:
            stop.set()
            if not keep_receiving:
                return


async def watch_lifeline(fd: int, stop: trio.Event) -> None:
    """Set ``stop`` once the supervisor's end of the worker's lifeline closes: the supervisor is
    gone (SIGKILL included), and a worker never serves on without it."""
    try:
        while True:
            await trio.lowlevel.wait_readable(fd)
            if not os.read(fd, 512):
                log.warning("the supervisor of this worker is gone; stopping")
                stop.set()
                return
    finally:
        os.close(fd)
