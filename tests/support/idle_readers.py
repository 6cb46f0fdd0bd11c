"""Readers that connect, ask for a large run's events and then never read: what each one makes a
real ``salvor serve`` hold, measured from its ``/proc/<pid>/status``.

Used by ``tests/daemon/serve/test_idle_readers.py`` (bounds) and
``tests/bench/bench_idle_readers.py`` (figures). The run is written straight into the store
before the daemon starts (a terminal run of large ``RandomObserved`` events: nothing recovers or
drives it). Each reader is a plain blocking socket with a small receive buffer: the kernel soon
stops taking what the daemon sends, and from then on whatever the daemon still means to send it
stays in the daemon.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from salvor.protocol import EMPTY_VIEW, RandomObserved, RunCompleted, RunStarted
from salvor.store import EventStore

from tests.support.spawn import ONE_PROCESS, salvor_process

AGENT = "sha256:" + "ab" * 32
# A reader's receive buffer: the kernel's floor, so that what the daemon sends stays with it.
RECEIVE_BUFFER = 4096
MIB = 1024 * 1024


def write_large_run(store_url: str, total_bytes: int, event_bytes: int = 100 * 1024) -> str:
    """A completed run whose log holds about ``total_bytes`` of event payload; its id."""
    run_id = str(uuid.uuid4())
    store = EventStore.open(store_url)
    try:
        _, view = store.append(run_id, [RunStarted(agent_def_hash=AGENT, input=None)], EMPTY_VIEW)
        count = max(1, total_bytes // event_bytes)
        for first in range(0, count, 16):
            batch = [
                RandomObserved(value=f"{n:08d}" + "x" * (event_bytes - 8))
                for n in range(first, min(count, first + 16))
            ]
            _, view = store.append(run_id, batch, view)
        store.append(run_id, [RunCompleted(output=None)], view)
    finally:
        store.close()
    return run_id


def status_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def _connect(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Before connecting, so that the window the daemon sees is small from the start.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    return sock


def idle_sse_reader(port: int, run_id: str) -> socket.socket:
    """A stream of the run's events that reads nothing, not even the answer's head."""
    sock = _connect(port)
    sock.sendall(
        f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    )
    return sock


def _masked_text_frame(text: str) -> bytes:
    payload = text.encode()
    mask = os.urandom(4)
    head = bytes([0x81])
    if len(payload) < 126:
        head += bytes([0x80 | len(payload)])
    else:
        head += bytes([0x80 | 126]) + struct.pack("!H", len(payload))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def idle_ws_reader(port: int, run_id: str) -> socket.socket:
    """A ``/v1/ws`` connection subscribed to the run that reads nothing past the handshake."""
    sock = _connect(port)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        byte = sock.recv(1)  # one at a time: nothing past the handshake's end is read
        if not byte:
            raise AssertionError(f"the daemon closed the handshake: {head!r}")
        head += byte
    assert head.startswith(b"HTTP/1.1 101"), head
    sock.sendall(_masked_text_frame(json.dumps({"op": "subscribe", "run": run_id})))
    return sock


class IdleDaemon:
    """A ``salvor serve`` over ``store_url`` on a free loopback port; ``pid`` for its figures."""

    def __init__(self, store_url: str, port: int, log: Path, *args: str) -> None:
        self.port = port
        env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
        self._log = log
        with open(log, "wb") as out:
            self.proc = salvor_process(
                [
                    "serve",
                    *ONE_PROCESS,
                    "--json",
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--store",
                    store_url,
                    "--wake-interval",
                    "0",
                    *args,
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=out,
            )
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise AssertionError(f"salvor serve did not start:\n{log.read_text()[-3000:]}")
        assert json.loads(line)["listening"], line

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def settled_rss_kib(pid: int, *, quiet_seconds: float = 1.5, bound_seconds: float = 60.0) -> int:
    """The daemon's VmRSS once it has stopped growing for ``quiet_seconds`` (sampled every 0.1 s,
    at most ``bound_seconds``): what it holds for readers that took all they will take."""
    deadline = time.monotonic() + bound_seconds
    last, since = status_kib(pid, "VmRSS"), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = status_kib(pid, "VmRSS")
        if abs(now - last) > 256:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_seconds:
            return now
    return status_kib(pid, "VmRSS")


@contextmanager
def idle_readers(port: int, run_id: str, sse: int, ws: int) -> Iterator[list[socket.socket]]:
    """``sse`` idle event streams and ``ws`` idle WebSockets of the run, closed at the end."""
    readers: list[socket.socket] = []
    try:
        for _ in range(sse):
            readers.append(idle_sse_reader(port, run_id))
        for _ in range(ws):
            readers.append(idle_ws_reader(port, run_id))
        yield readers
    finally:
        for reader in readers:
            reader.close()
