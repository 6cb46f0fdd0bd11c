"""``salvor serve --workers N``: one service of N daemon processes behind one listening address.

One interpreter uses one core. The supervisor (the process the operator started, systemd's main
process) does what must happen once for the service and leaves the serving to its workers:

* It takes the store lock, so a second daemon or a ``salvor resume`` beside the service is
  refused as it is beside one ``salvor serve`` (the workers take none).
* It binds the listening address itself (TCP, or the Unix socket with its lock and mode), and
  each worker serves that one socket, inherited: the kernel hands each new connection to
  whichever worker accepts it first, and a worker's death loses nothing queued. The workers
  keep a tally of their open connections in memory the supervisor makes (``ConnectionTally``),
  so that a worker ahead of its siblings leaves new connections to them (a kept-alive
  connection stays with the worker that accepted it); the supervisor marks a dead worker's
  slot, so nothing is left to it.
* It starts the workers, each ``salvor serve`` with the operator's own arguments (never a
  secret: the token and keys reach them by the same variables and files), told by its
  environment which worker it is (``_worker_role``). Each worker is a node over the store:
  it claims the runs it drives and the outbox rows it delivers, and takes over the runs of a
  dead sibling (``cluster``). Worker 0 starts first, so the service's own start-up recovery is
  one worker's sweep rather than N racing ones. A worker's loopback model proxy is its own: on
  a free port, or with ``--proxy-port P`` on port P + its index.
* It tells systemd READY=1 once every worker said READY=1 to it (each worker's NOTIFY_SOCKET is
  a datagram socket of the supervisor's, whose messages the kernel tags with their sender's
  pid), WATCHDOG=1
  while every worker keeps pinging it, STOPPING=1 when it stops.
* It starts again a worker that dies, after a backoff that doubles per quick death, logging how
  it ended; a worker that dies within ``STABLE_SECONDS`` of its start ``CRASH_LIMIT`` times in a
  row (a crash loop: a store it cannot open, a port it cannot bind) stops the service with one
  sentence and a non-zero exit instead of spinning.
* SIGTERM or SIGINT: STOPPING=1, SIGTERM to every worker, each stops as ``salvor serve`` does,
  and the supervisor waits for them within their own drain and shutdown deadlines plus
  ``STOP_MARGIN_SECONDS``; one still running then is SIGKILLed (its runs keep their logs).

A worker whose supervisor is gone (SIGKILL included) stops as on SIGTERM: each holds the read
end of a pipe only the supervisor writes to (its lifeline), so no worker outlives it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import struct
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import trio
from salvor.protocol import ErrorCode
from salvor.store import EventStore
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ..runs import SERVE, own_store
from ..web import (
    BACKLOG,
    ConnectionTally,
    OperationRefused,
    UnixSocketRefused,
    bind_tcp_listener,
    claim_unix_socket,
    listener_url,
)
from ._notify import Notifier
from ._serve import ServeConfig
from ._worker_role import WorkerRole

log = logging.getLogger("salvor.workers")

# A worker that lived this long was not crash-looping: its slot's count of quick deaths resets.
STABLE_SECONDS = 10.0
# Quick deaths in a row after which the supervisor gives up and stops the service.
CRASH_LIMIT = 5
# The wait before a dead worker starts again: the first, doubling per quick death, at most.
BACKOFF_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 10.0
# A worker that has not said READY=1 this long after its start is killed (a quick death).
START_SECONDS = 60.0
# Past the workers' own stop deadlines (drain + shutdown), how long the supervisor waits before
# it SIGKILLs a worker that has not exited.
STOP_MARGIN_SECONDS = 5.0
# ``struct ucred``: pid, uid, gid.
_UCRED = struct.Struct("3i")


def unshared_store(store_url: str) -> str | None:
    """Why several processes cannot serve ``store_url`` together, in words that follow "because"
    (None: they can). An in-memory SQLite database lives inside the one process that opens it:
    each worker would serve a store of its own, and the supervisor's lock would guard none."""
    try:
        url = make_url(store_url)
    except (ArgumentError, ValueError):
        return None  # the store refuses it in its own words
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or url.query.get("mode") == "memory"
    ):
        return f"the store {store_url} is an in-memory SQLite database only one process can see"
    return None


class CrashLoop(Exception):
    """A worker kept dying at its start; the message says which and how (one sentence)."""


def worker_command(argv: list[str], index: int, proxy_port: int) -> list[str]:
    """A worker's command line: the supervisor's own ``salvor serve`` arguments, as one worker
    (the last ``--workers`` wins), with its own model proxy port when one was fixed."""
    command = [sys.executable, "-m", "salvor.daemon.cli", *argv, "--workers", "1"]
    if proxy_port:
        command += ["--proxy-port", str(proxy_port + index)]
    return command


def describe_exit(code: int) -> str:
    """``exited with status 3`` or ``was killed by SIGKILL``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


@dataclass(slots=True)
class _Slot:
    """One worker's place: the process in it now, and how its lives went."""

    index: int
    process: trio.Process | None = None
    lifeline: int = -1
    lives: int = 0
    quick_deaths: int = 0
    ready: bool = False
    # Set once this slot's worker first says READY=1 (the service's start waits for all).
    first_ready: trio.Event = field(default_factory=trio.Event)
    last_ping: float = 0.0

    @property
    def pid(self) -> int | None:
        return (
            None
            if self.process is None or self.process.returncode is not None
            else (self.process.pid)
        )


class _Notices:
    """The datagram socket the workers' notify messages arrive on, each with its sender's pid.

    An abstract socket (Linux): no file to leave behind when the supervisor is killed. Anyone on
    the machine could send to it, so a message counts only when the kernel names a live
    worker's pid as its sender (``SO_PASSCRED``).
    """

    def __init__(self) -> None:
        name = f"salvor-workers-{os.getpid()}-{secrets.token_hex(8)}"
        # NOTIFY_SOCKET spells an abstract address with a leading "@" (``Notifier`` reads it).
        self.path = "@" + name
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            raw.bind("\0" + name)
        except BaseException:
            raw.close()
            raise
        self._socket = trio.socket.from_stdlib_socket(raw)

    async def receive(self) -> tuple[int | None, list[str]]:
        """The next message: its sender's pid (None when the kernel did not say) and its lines."""
        data, ancillary, _, _ = await self._socket.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
        sender = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                sender, _, _ = _UCRED.unpack(payload[: _UCRED.size])
        return sender, data.decode("utf-8", "replace").splitlines()

    def close(self) -> None:
        self._socket.close()


@contextlib.asynccontextmanager
async def _listening_socket(config: ServeConfig) -> AsyncIterator[tuple[int, str]]:
    """Bind and listen on ``config``'s address for the block: the descriptor the workers inherit
    and the URL it serves. A Unix socket's file is removed at the end (as ``serve`` does).

    Raises:
        OperationRefused: listen_failed, the address cannot be bound; nothing is left open.
    """
    if config.unix_socket is not None:
        try:
            unix = await trio.to_thread.run_sync(claim_unix_socket, config.unix_socket)
        except UnixSocketRefused as exc:
            raise OperationRefused(ErrorCode.LISTEN_FAILED, str(exc)) from None
        try:
            yield unix.listening(BACKLOG), f"unix:{config.unix_socket}"
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(unix.release)
        return
    try:
        sock = await trio.to_thread.run_sync(bind_tcp_listener, config.host, config.port)
    except OSError as exc:
        raise OperationRefused(
            ErrorCode.LISTEN_FAILED,
            f"cannot listen on {config.listen} ({exc.strerror or exc}); "
            "stop what holds it, or pick another address with --listen",
        ) from None
    with sock:
        yield sock.fileno(), listener_url(sock)


def _open_store_once(store_url: str) -> None:
    """Open (creating or upgrading) the store and close it again, before any worker starts: a
    store no worker could open (unwritable, too new, unreachable) is refused in its own sentence
    instead of each worker dying at its start until the crash loop stopped the service, and the
    workers find its schema current. Blocking.

    Raises:
        StoreUnavailable / StoreTooNew: the store cannot be opened; nothing was started.
    """
    EventStore.open(store_url).close()


def _check_proxy_ports(first: int, workers: int) -> None:
    """Refuse before any worker starts when a fixed model proxy port of theirs (``first`` +
    the worker's index) cannot be bound: each such worker would die at its start until the
    crash loop stopped the service. Blocking.

    Raises:
        OperationRefused: listen_failed, naming the port; nothing is left open.
    """
    if not first:
        return  # each worker's proxy takes a free port
    for index in range(workers):
        port = first + index
        try:
            if port > 65535:
                raise OSError(f"worker {index}'s port, past 65535")
            bind_tcp_listener("127.0.0.1", port).close()
        except OSError as exc:
            raise OperationRefused(
                ErrorCode.LISTEN_FAILED,
                f"the model proxy cannot listen on 127.0.0.1:{port} ({exc.strerror or exc}); "
                f"stop what holds that port, or give salvor serve another --proxy-port (worker "
                f"i's proxy takes port P + i; 0 picks free ones)",
            ) from None


async def supervise(
    config: ServeConfig,
    argv: list[str],
    workers: int,
    *,
    on_ready: Callable[[list[str], list[int]], None] = lambda binds, pids: None,
) -> None:
    """Serve with ``workers`` worker processes until SIGTERM or SIGINT; ``argv`` is the
    supervisor's own ``salvor serve`` arguments. ``on_ready`` is called once every worker is
    ready, with the URL served and the workers' pids.

    Raises:
        StoreOwned: another live salvor holds the store; nothing was started.
        StoreUnavailable / StoreTooNew: the store cannot be opened; nothing was started.
        OperationRefused: listen_failed, the address or a fixed model proxy port cannot be
            bound; nothing was started.
        CrashLoop: a worker kept dying at its start; every worker was stopped first.
    """
    async with (
        own_store(config.store_url, SERVE, share=False) as locks,
        _listening_socket(config) as (listen_fd, url),
    ):
        await trio.to_thread.run_sync(_open_store_once, config.store_url)
        await trio.to_thread.run_sync(_check_proxy_ports, config.proxy_port, workers)
        await trio.to_thread.run_sync(locks.announce, url)
        notices = await trio.to_thread.run_sync(_Notices)
        tally = ConnectionTally.create(workers)
        try:
            supervisor = _Supervisor(config, argv, workers, listen_fd, notices, tally)
            await supervisor.run(url, on_ready)
        finally:
            notices.close()
            tally.close()


class _Supervisor:
    def __init__(
        self,
        config: ServeConfig,
        argv: list[str],
        workers: int,
        listen_fd: int,
        notices: _Notices,
        tally: ConnectionTally,
    ) -> None:
        self._config = config
        self._argv = argv
        self._listen_fd = listen_fd
        # The workers' open connections, so that each takes its share of them (the supervisor
        # marks a dead worker's slot, so that its siblings defer nothing to it).
        self._tally = tally
        self._notices = notices
        self._slots = [_Slot(index) for index in range(workers)]
        self._systemd = Notifier()
        # Set by a signal or a crash loop: every keeper lets its worker go from then on.
        self._stop = trio.Event()
        self._crash_loop: str | None = None

    async def run(self, url: str, on_ready: Callable[[list[str], list[int]], None]) -> None:
        config = self._config
        async with trio.open_nursery() as services:
            services.start_soon(self._receive_notices)
            services.start_soon(self._watch_signals)
            if self._systemd.watchdog_interval:
                services.start_soon(self._relay_watchdog, self._systemd.watchdog_interval)
            async with trio.open_nursery() as keepers:
                services.start_soon(self._start_all, keepers, url, on_ready)
                await self._stop.wait()
                self._systemd.send("STOPPING=1")
                for slot in self._slots:
                    if slot.pid is not None:
                        slot.process.send_signal(signal.SIGTERM)
                # Each keeper returns once its worker exited; one still running at the deadline
                # is SIGKILLed as its keeper is cancelled.
                keepers.cancel_scope.deadline = (
                    trio.current_time()
                    + config.drain_seconds
                    + config.shutdown_seconds
                    + STOP_MARGIN_SECONDS
                )
            services.cancel_scope.cancel(reason="every worker stopped")
        if self._crash_loop is not None:
            raise CrashLoop(self._crash_loop)
        log.info("salvor stopped (%d workers)", len(self._slots))

    async def _start_all(
        self,
        keepers: trio.Nursery,
        url: str,
        on_ready: Callable[[list[str], list[int]], None],
    ) -> None:
        """Worker 0 first (its first takeover sweep recovers the service), then the others;
        READY=1 to systemd once each of them said it."""
        first, *others = self._slots
        keepers.start_soon(self._keep, first)
        await first.first_ready.wait()
        for slot in others:
            keepers.start_soon(self._keep, slot)
        for slot in others:
            await slot.first_ready.wait()
        pids = [slot.pid for slot in self._slots if slot.pid is not None]
        log.info(
            "salvor serving on %s with %d workers (pids %s)",
            url,
            len(self._slots),
            ", ".join(map(str, pids)),
        )
        self._systemd.send("READY=1")
        on_ready([url], pids)

    async def _keep(self, slot: _Slot) -> None:
        """Keep a worker in ``slot`` until the service stops: start it, wait for its end, start
        it again after the backoff; give up on a crash loop (stopping the service).

        Cancellation: the worker running then is SIGKILLed and waited for.
        """
        try:
            while not self._stop.is_set():
                try:
                    process = await self._spawn(slot)
                except OSError as exc:
                    # No process to start (out of processes or descriptors, no interpreter):
                    # waiting would not bring one.
                    self._crash_loop = (
                        f"cannot start worker {slot.index} ({exc.strerror or exc}), so salvor "
                        "serve stopped"
                    )
                    self._stop.set()
                    return
                started = trio.current_time()
                code = await self._life(slot, process)
                if self._stop.is_set():
                    if code not in (0, -signal.SIGTERM):  # SIGTERM: stopped while starting
                        log.warning("worker %d %s while stopping", slot.index, describe_exit(code))
                    return
                lived = trio.current_time() - started
                slot.quick_deaths = slot.quick_deaths + 1 if lived < STABLE_SECONDS else 0
                if slot.quick_deaths >= CRASH_LIMIT:
                    self._crash_loop = (
                        f"worker {slot.index} {describe_exit(code)} within {STABLE_SECONDS:g} s "
                        f"of its start {CRASH_LIMIT} times in a row, so salvor serve stopped "
                        "(its log above says why)"
                    )
                    log.error("%s", self._crash_loop)
                    self._stop.set()
                    return
                delay = min(
                    BACKOFF_SECONDS * 2 ** max(slot.quick_deaths - 1, 0), BACKOFF_CAP_SECONDS
                )
                log.warning(
                    "worker %d (pid %d) %s after %.1f s; starting it again in %.1f s",
                    slot.index,
                    process.pid,
                    describe_exit(code),
                    lived,
                    delay,
                )
                with trio.move_on_after(delay):
                    await self._stop.wait()
        finally:
            await self._end(slot)

    async def _spawn(self, slot: _Slot) -> trio.Process:
        """Start the worker of ``slot``, holding its lifeline's write end."""
        lifeline, slot.lifeline = os.pipe()
        role = WorkerRole(
            index=slot.index,
            listen_fd=self._listen_fd,
            lifeline_fd=lifeline,
            tally_fd=self._tally.fd,
        )
        env = {**os.environ, **role.environment(), "NOTIFY_SOCKET": self._notices.path}
        env.pop("WATCHDOG_PID", None)
        env.pop("WATCHDOG_USEC", None)
        if self._systemd.watchdog_interval:
            # The worker pings at half of it, as it would ping systemd.
            env["WATCHDOG_USEC"] = str(int(self._systemd.watchdog_interval * 2_000_000))
        slot.ready = False
        slot.lives += 1
        try:
            slot.process = await trio.lowlevel.open_process(
                worker_command(self._argv, slot.index, self._config.proxy_port),
                env=env,
                pass_fds=(self._listen_fd, lifeline, self._tally.fd),
            )
        finally:
            os.close(lifeline)
        slot.last_ping = trio.current_time()
        return slot.process

    async def _life(self, slot: _Slot, process: trio.Process) -> int:
        """Wait for the worker's end; one not READY within ``START_SECONDS`` is killed."""
        async with trio.open_nursery() as nursery:

            async def start_deadline() -> None:
                await trio.sleep(START_SECONDS)
                if not slot.ready and not self._stop.is_set():
                    log.warning(
                        "worker %d (pid %d) did not say READY=1 within %g s of its start; "
                        "killing it",
                        slot.index,
                        process.pid,
                        START_SECONDS,
                    )
                    process.kill()

            nursery.start_soon(start_deadline)
            code = await process.wait()
            nursery.cancel_scope.cancel(reason="the worker ended")
        self._tally.mark_not_serving(slot.index)
        slot.ready = False
        os.close(slot.lifeline)
        slot.lifeline = -1
        return code

    async def _end(self, slot: _Slot) -> None:
        """Let go of ``slot``'s worker: SIGKILL it if it still runs, and wait for it."""
        with trio.CancelScope(shield=True):
            process = slot.process
            if process is not None and process.returncode is None:
                log.warning(
                    "worker %d (pid %d) did not stop in time; killing it (its runs keep their "
                    "logs and resume on the next start)",
                    slot.index,
                    process.pid,
                )
                process.kill()
                await process.wait()
            if slot.lifeline >= 0:
                os.close(slot.lifeline)
                slot.lifeline = -1

    async def _receive_notices(self) -> None:
        while True:
            sender, lines = await self._notices.receive()
            slot = next((s for s in self._slots if s.pid is not None and s.pid == sender), None)
            if slot is None:
                continue  # a worker already gone, or not a worker at all
            if "WATCHDOG=1" in lines:
                slot.last_ping = trio.current_time()
            if "READY=1" in lines and not slot.ready:
                slot.ready = True
                slot.last_ping = trio.current_time()
                slot.first_ready.set()
                if slot.lives > 1:
                    log.info("worker %d (pid %d) serves again", slot.index, sender)

    async def _relay_watchdog(self, interval: float) -> None:
        """WATCHDOG=1 to systemd every ``interval`` while every serving worker pinged within the
        watchdog's time (a starting worker has ``START_SECONDS``): a hung worker lets systemd's
        watchdog act on the service."""
        while True:
            now = trio.current_time()
            stale = [
                slot.index
                for slot in self._slots
                if slot.ready and now - slot.last_ping > 2 * interval
            ]
            if stale:
                log.warning("worker %s stopped pinging; systemd's watchdog is not fed", stale)
            else:
                self._systemd.send("WATCHDOG=1")
            await trio.sleep(interval)

    async def _watch_signals(self) -> None:
        # Held for the supervisor's whole life: a second signal during the stop changes nothing.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if not self._stop.is_set():
                    log.info("%s: stopping the workers", signal.Signals(signum).name)
                self._stop.set()
