"""``salvor serve --workers N``: one address, N worker processes, one service to systemd.

Every service here is a real ``salvor serve --workers 2`` process whose workers are real
``salvor serve`` processes, started with ``NOTIFY_SOCKET`` pointing at a datagram socket this
test owns, so "the service is ready" is the supervisor's own READY=1. Which worker answered a
request is the ``worker`` field of ``/v1/health``; the workers are found in ``/proc`` as the
supervisor's children.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import httpx
import pytest
import trio
from salvor.daemon.cli._arguments import cores

from tests.daemon.serve.test_lifecycle import NotifySocket
from tests.support.ports import free_port
from tests.support.spawn import open_salvor_process, run_salvor

REPO = Path(__file__).resolve().parents[3]
WAIT = 60
TOKEN_VAR = "SALVOR_TEST_WORKERS_TOKEN"
# Fresh connections tried before concluding that a worker never answers (the kernel hands each
# to whichever worker accepts first: both answer within a few).
CONNECTIONS = 400


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    children = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z" and int(fields[1]) == pid:
            children.add(int(entry.name))
    return children


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


class Service:
    """One ``salvor serve --workers 2`` process (the supervisor) and what it wrote."""

    def __init__(self, tmp: Path, store_url: str, *extra: str, workers: str | None = "2") -> None:
        """``workers`` None: no ``--workers`` flag (the default, one per core)."""
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            "serve",
            *(("--workers", workers) if workers is not None else ()),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--store",
            store_url,
            "--wake-interval",
            "0",
            *extra,
        ]
        self.notify = NotifySocket()
        self.headers: dict[str, str] = {}
        # Every worker pid seen, so none outlives the test whatever it checked.
        self.seen: set[int] = set()
        self.process = None
        self._log = None

    async def start(self, env: dict[str, str] | None = None) -> None:
        self._log = await trio.to_thread.run_sync(open, self.tmp / f"service-{self.port}.log", "wb")
        self.process = await open_salvor_process(
            self.args,
            env={**os.environ, "NOTIFY_SOCKET": self.notify.path, **(env or {})},
            cwd=REPO,
            stdout=self._log,
            stderr=self._log,
        )

    async def wait_ready(self) -> None:
        async with trio.open_nursery() as nursery:

            async def watch_exit() -> None:
                code = await self.process.wait()
                raise AssertionError(f"the service exited {code} before READY=1:\n{self.output()}")

            nursery.start_soon(watch_exit)
            await self.notify.wait_for("READY=1", timeout=WAIT)
            nursery.cancel_scope.cancel()

    def workers(self) -> set[int]:
        workers = _children(self.process.pid)
        self.seen |= workers
        return workers

    def output(self) -> str:
        self._log.flush()
        return (self.tmp / f"service-{self.port}.log").read_text(errors="replace")

    async def answering_workers(self, wanted: set[int]) -> set[int]:
        """Ask ``/v1/health`` over fresh connections until each worker of ``wanted`` answered
        (at most ``CONNECTIONS``); every request must be answered. Returns those that did."""
        seen: set[int] = set()
        for _ in range(CONNECTIONS):
            async with httpx.AsyncClient(base_url=self.url, timeout=WAIT) as client:
                answer = await client.get("/v1/health", headers=self.headers)
            assert answer.status_code == 200, answer.text
            seen.add(answer.json()["worker"])
            if wanted <= seen:
                break
        return seen

    async def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        with trio.fail_after(WAIT):
            return await self.process.wait()

    async def cleanup(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.workers()
            self.process.kill()
            with trio.move_on_after(WAIT):
                await self.process.wait()
        for pid in self.seen:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.notify.close()
        if self._log is not None:
            self._log.close()


@pytest.fixture
async def services(tmp_path):
    made: list[Service] = []

    def make(store_url: str, *extra: str, workers: str | None = "2") -> Service:
        service = Service(tmp_path, store_url, *extra, workers=workers)
        made.append(service)
        return service

    yield make
    for service in made:
        await service.cleanup()


async def test_two_workers_answer_on_one_port_and_keep_the_token_off_their_command_lines(
    services, store_url
):
    token = "workers-" + "t" * 40
    service = services(store_url, "--auth-token", TOKEN_VAR)
    await service.start(env={TOKEN_VAR: token})
    await service.wait_ready()
    service.headers = {"Authorization": f"Bearer {token}"}
    workers = service.workers()
    assert len(workers) == 2, service.output()

    assert await service.answering_workers({0, 1}) == {0, 1}
    async with httpx.AsyncClient(base_url=service.url, timeout=WAIT) as client:
        refused = await client.get("/v1/runs")
        assert refused.status_code == 401, refused.text
        listed = await client.get("/v1/runs", headers={"Authorization": f"Bearer {token}"})
        assert listed.status_code == 200, listed.text
        metrics = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert metrics.status_code == 200, metrics.text
        assert 'salvor_appends_total{worker="' in metrics.text

    for pid in {service.process.pid, *workers}:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"serve" in command_line
        assert token.encode() not in command_line
        assert TOKEN_VAR.encode() in command_line  # the variable's name, never its value

    assert await service.stop() == 0
    assert not any(_alive(pid) for pid in workers)


async def test_by_default_one_worker_per_core_serves(services, tmp_path):
    service = services(f"sqlite:///{tmp_path / 'salvor.db'}", workers=None)
    await service.start()
    await service.wait_ready()
    workers = service.workers()
    # One core: one process, no supervisor (nothing to supervise).
    assert len(workers) == (cores() if cores() > 1 else 0), service.output()
    assert await service.answering_workers(set(range(len(workers)))) >= set(range(len(workers)))
    assert await service.stop() == 0
    assert not any(_alive(pid) for pid in workers)


@pytest.mark.parametrize("store", ["sqlite://", "sqlite:///:memory:"])
async def test_over_an_in_memory_store_auto_is_one_process_and_a_count_is_refused(store, tmp_path):
    def serve(*args: str):
        return run_salvor(
            ["serve", "--store", store, "--listen", f"127.0.0.1:{free_port()}", *args],
            capture_output=True,
            text=True,
            timeout=WAIT,
            cwd=tmp_path,  # the store's lock file lands beside the "file" the URL names
        )

    # auto says why it serves alone; that one process then refuses the store in its own words.
    alone = await trio.to_thread.run_sync(serve)
    first, refusal = alone.stderr.strip().splitlines()
    assert "--workers auto: one process serves, because" in first, alone.stderr
    assert "in-memory SQLite" in first
    assert alone.returncode == 1 and refusal.startswith("salvor: the store URL"), alone.stderr
    assert "worker" not in refusal
    counted = await trio.to_thread.run_sync(serve, "--workers", "3")
    assert counted.returncode == 2, counted.stderr
    assert counted.stderr.startswith("salvor: --workers 3 needs a store every worker process")
    assert len(counted.stderr.strip().splitlines()) == 1, counted.stderr


async def test_a_taken_proxy_port_of_a_worker_is_refused_before_any_starts(tmp_path):
    proxy_port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", proxy_port + 1))  # worker 1's
        taken.listen()
        result = await trio.to_thread.run_sync(
            lambda: run_salvor(
                [
                    "serve",
                    "--workers",
                    "2",
                    "--store",
                    f"sqlite:///{tmp_path / 'salvor.db'}",
                    "--listen",
                    f"127.0.0.1:{free_port()}",
                    "--proxy-port",
                    str(proxy_port),
                ],
                capture_output=True,
                text=True,
                timeout=WAIT,
            )
        )
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"salvor: the model proxy cannot listen on 127.0.0.1:{proxy_port + 1}")
    assert "--proxy-port" in line


async def test_a_killed_worker_is_started_again_while_the_port_answers(services, tmp_path):
    store = f"sqlite:///{tmp_path / 'salvor.db'}"
    service = services(store)
    await service.start()
    await service.wait_ready()
    first = service.workers()
    assert len(first) == 2, service.output()

    # The supervisor holds the store for its workers: a command-line drive beside it is refused,
    # naming the supervisor.
    second = await trio.to_thread.run_sync(
        lambda: run_salvor(["wake", "--store", store], capture_output=True, text=True, timeout=WAIT)
    )
    assert second.returncode != 0, second.stderr
    assert f"salvor serve (pid {service.process.pid}, {service.url})" in second.stderr

    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    # Every request meanwhile is answered (by the other worker, or the new one), until the
    # supervisor has started a worker in the dead one's place and both answer again.
    with trio.fail_after(WAIT):
        while True:
            now = service.workers()
            if len(now) == 2 and victim not in now:
                break
            await service.answering_workers(set())
            await trio.sleep(0.05)
    assert await service.answering_workers({0, 1}) == {0, 1}
    assert "was killed by SIGKILL" in service.output()

    workers = service.workers()
    assert await service.stop() == 0
    assert not any(_alive(pid) for pid in workers), service.output()
    assert "STOPPING=1" in await _drain(service.notify)


async def test_workers_stop_when_their_supervisor_is_killed(services, tmp_path):
    service = services(f"sqlite:///{tmp_path / 'salvor.db'}")
    await service.start()
    await service.wait_ready()
    workers = service.workers()
    assert len(workers) == 2

    service.process.send_signal(signal.SIGKILL)
    with trio.fail_after(WAIT):
        await service.process.wait()
        # No worker outlives its supervisor: each hears its lifeline close and stops.
        while any(_alive(pid) for pid in workers):
            await trio.sleep(0.05)


async def test_a_worker_that_cannot_start_ends_the_service_before_ready(services, tmp_path):
    proxy_port = free_port()
    service = services(f"sqlite:///{tmp_path / 'salvor.db'}", "--proxy-port", str(proxy_port))
    await service.start()
    # Worker 1's model proxy port (--proxy-port P gives worker i port P + i) is taken once the
    # supervisor checked it was free and worker 0 serves (worker 1 starts after that, and takes
    # an interpreter's start to bind): worker 1 can never start.
    with trio.fail_after(WAIT):
        while "worker 0 serving" not in service.output():
            await trio.sleep(0.01)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", proxy_port + 1))
        taken.listen()
        with trio.fail_after(3 * WAIT):
            code = await service.process.wait()
    output = service.output()
    assert code == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("salvor: worker 1 exited with status 1 within"), output
    assert "times in a row" in last
    # systemd never heard READY=1: one worker served, the other never did.
    assert "worker 0 serving" in output
    assert "READY=1" not in await _drain(service.notify)
    assert not _children(service.process.pid)


async def _drain(notify: NotifySocket) -> list[str]:
    """The datagrams that arrived and were not read yet (and those read before)."""
    with trio.move_on_after(0.5):
        while True:
            await notify.receive()
    return notify.messages


async def test_the_watchdog_is_fed_while_every_worker_pings(services, tmp_path):
    service = services(f"sqlite:///{tmp_path / 'salvor.db'}")
    # systemd's watchdog of 2 s: the supervisor feeds it every second, its workers ping it so.
    await service.start(env={"WATCHDOG_USEC": "2000000"})
    await service.wait_ready()
    await service.notify.wait_for("WATCHDOG=1", timeout=WAIT)

    stopped = min(service.workers())
    os.kill(stopped, signal.SIGSTOP)
    try:
        with trio.fail_after(WAIT):
            while "systemd's watchdog is not fed" not in service.output():
                await trio.sleep(0.1)
    finally:
        os.kill(stopped, signal.SIGCONT)
    # Pinging again, the worker lets the supervisor feed systemd again.
    await _drain(service.notify)
    await service.notify.wait_for("WATCHDOG=1", timeout=WAIT)
    assert await service.stop() == 0
