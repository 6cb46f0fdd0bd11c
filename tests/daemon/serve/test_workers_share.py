"""The workers of ``salvor serve --workers N`` share out kept-alive connections
(``daemon/web/_connection_share.py``): a worker ahead of a serving sibling leaves new
connections to it, a sibling that ended is left nothing.

The service test makes one worker ahead by stopping the other (SIGSTOP) while connections open
(the running one takes them all, after waiting for its stopped sibling in vain), then continues
it: the connections opened next go to the sibling. Without the tally each would go to whichever
worker accepted first.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter

import trio
from salvor.daemon.serve import WorkerRole
from salvor.daemon.web import ConnectionTally

from tests.bench.keep_alive import Connection, connect
from tests.daemon.serve.test_workers import WAIT, services  # noqa: F401 -- the fixture

# Connections the running worker takes while its sibling is stopped, and those opened after.
AHEAD = 12
AFTER = 8


def views(workers: int) -> tuple[ConnectionTally, list[ConnectionTally]]:
    """The supervisor's tally and each worker's view of it (on a copy of its descriptor, as a
    worker inherits one)."""
    made = ConnectionTally.create(workers)
    return made, [ConnectionTally(os.dup(made.fd), index) for index in range(workers)]


def test_a_worker_ahead_of_a_serving_sibling_by_more_than_one_defers():
    supervisor, (first, second) = views(2)
    try:
        assert supervisor.counts() == [-1, -1]
        first.serving()
        first.opened()
        first.opened()
        assert not first.ahead()  # its sibling serves in no slot yet
        second.serving()
        assert first.ahead() and not second.ahead()
        second.opened()
        assert not first.ahead()
        first.opened()
        first.opened()
        assert first.ahead()
        # Its sibling ended: nothing is left to it.
        supervisor.mark_not_serving(1)
        assert not first.ahead() and supervisor.counts() == [4, -1]
        first.closed()
        assert supervisor.counts() == [3, -1]
    finally:
        for tally in (supervisor, first, second):
            tally.close()


def test_a_worker_reads_its_tally_from_the_role_its_supervisor_gave():
    supervisor = ConnectionTally.create(2)
    try:
        role = WorkerRole(index=1, listen_fd=3, lifeline_fd=4, tally_fd=supervisor.fd)
        assert WorkerRole.from_environment(role.environment()) == role
        tally = WorkerRole(index=1, listen_fd=3, lifeline_fd=4, tally_fd=os.dup(supervisor.fd))
        view = tally.connection_tally()
        view.serving()
        view.opened()
        assert supervisor.counts() == [-1, 1]
        view.close()
        assert WorkerRole(index=0, listen_fd=3, lifeline_fd=4).connection_tally() is None
    finally:
        supervisor.close()


async def _open(url: str, connections: list[Connection], count: int) -> Counter:
    """Open ``count`` connections one after another, kept open; which worker answered each."""
    answered: Counter = Counter()
    for _ in range(count):
        connection = await connect(url)
        connections.append(connection)
        status, body = await connection.request("GET", "/v1/health")
        assert status == 200, body
        answered[json.loads(body)["worker"]] += 1
    return answered


async def _answer_once(url: str) -> int:
    """The worker that answered a request on a connection of its own, closed after."""
    connection = await connect(url)
    try:
        status, body = await connection.request("GET", "/v1/health")
        assert status == 200, body
        return json.loads(body)["worker"]
    finally:
        await connection.stream.aclose()


async def test_connections_opened_while_a_worker_is_ahead_go_to_its_sibling(services, tmp_path):  # noqa: F811
    service = services(f"sqlite:///{tmp_path / 'salvor.db'}")
    await service.start()
    await service.wait_ready()
    paused = min(service.workers())
    connections: list[Connection] = []
    try:
        os.kill(paused, signal.SIGSTOP)
        try:
            with trio.fail_after(WAIT):
                ahead = await _open(service.url, connections, AHEAD)
        finally:
            os.kill(paused, signal.SIGCONT)
        [(running, taken)] = ahead.items()
        assert taken == AHEAD

        with trio.fail_after(WAIT):
            # Until the continued worker answers (it has a stop's worth of work to catch up on),
            # on connections closed at once: they leave the tally as it was.
            while await _answer_once(service.url) == running:
                pass
            after = await _open(service.url, connections, AFTER)
        # Every one (one may be taken by the worker ahead, its sibling slow to wake on a busy
        # machine: without the tally about half would be).
        assert after[1 - running] >= AFTER - 1, after
    finally:
        for connection in connections:
            await connection.stream.aclose()
    assert await service.stop() == 0
