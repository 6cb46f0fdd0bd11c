"""A real ``salvor serve`` process: restart recovery, graceful stop, the wake sweeper, systemd.

Every daemon here is a ``salvor serve`` process of its own (tests/support/spawn) on a
free loopback port, over real SQLite (and PostgreSQL when configured). Each
one is started with ``NOTIFY_SOCKET`` pointing at a datagram socket this test
owns, so "the daemon is ready" is the daemon's own ``READY=1``, not a guess.
The scripted provider counts the model calls it served (per request hash) and
the demo tools write their side effects to a ledger file, so "no completed
call was repeated" is counted in the world, across killed processes.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import trio
from salvor.daemon.recording import _store_access as store_access
from salvor.daemon.serve._serve import ServeConfig
from salvor.protocol import EMPTY_VIEW, RunStarted, SleepStarted, check_batch, format_instant
from salvor.store import EventStore

from tests.daemon.api.test_stream import Holds, read_stream
from tests.support.api_server import agent_toml
from tests.support.ports import free_port
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script
from tests.support.spawn import CLI, ONE_PROCESS, ForkedTrioProcess, open_salvor_process, run_salvor

REPO = Path(__file__).resolve().parents[3]
WAIT = 30
SIGKILLED = -signal.SIGKILL


class NotifySocket:
    """A unix datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self) -> None:
        # AF_UNIX paths are short (108 bytes): not under pytest's deep tmp_path.
        self._dir = tempfile.mkdtemp(prefix="salvor-notify-", dir="/tmp")
        self.path = os.path.join(self._dir, "notify.sock")
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        raw.bind(self.path)
        self._sock = trio.socket.from_stdlib_socket(raw)
        self.messages: list[str] = []

    async def receive(self) -> str:
        data = await self._sock.recv(4096)
        message = data.decode()
        self.messages.append(message)
        return message

    async def wait_for(self, wanted: str, *, timeout: float = WAIT) -> list[str]:
        """Read datagrams until ``wanted`` arrives; returns everything
        read meanwhile (it included)."""
        seen = []
        with trio.fail_after(timeout):
            while True:
                message = await self.receive()
                seen.append(message)
                if message == wanted:
                    return seen

    def close(self) -> None:
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class Daemon:
    """One ``salvor serve`` subprocess; ``start`` returns once it has said READY=1."""

    def __init__(
        self,
        store_url: str,
        tmp: Path,
        *,
        wake_interval: float = 0,
        effects: Path | None = None,
        endpoints=lambda: (),
    ) -> None:
        self.store_url = store_url
        # The model endpoints each life declares (the test's providers so far).
        self.endpoints = endpoints
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.wake_interval = wake_interval
        self.effects = effects
        self.process: trio.Process | ForkedTrioProcess | None = None
        self.notify: NotifySocket | None = None
        self.lives = 0
        self._log = None

    def command(self) -> list[str]:
        """The daemon's salvor arguments (tests/support/spawn starts the process)."""
        return [
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--store",
            self.store_url,
            "--demo-tools",
            *ONE_PROCESS,
            "--wake-interval",
            str(self.wake_interval),
            *(arg for url in self.endpoints() for arg in ("--model-endpoint", url)),
        ]

    async def start(
        self, *, env: dict[str, str] | None = None, wait_ready: bool = True, exec_d: bool = False
    ) -> None:
        """Start a life of the daemon; ``exec_d`` for a test of what systemd sees of the process
        (a fresh interpreter, not a child of the fork server)."""
        self.lives += 1
        if self.lives > 1:
            # A fresh port for each life: between lives the old one is free, and another test's
            # process may bind it first (a restart would then fail to listen, not to recover).
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
        if self.notify is not None:
            self.notify.close()  # the previous life's socket and log
        if self._log is not None:
            self._log.close()
        self.notify = NotifySocket()
        environment = {**os.environ, "NOTIFY_SOCKET": self.notify.path, **(env or {})}
        if self.effects is not None:
            environment["SALVOR_DEMO_EFFECTS"] = str(self.effects)
        self._log = await trio.to_thread.run_sync(
            open, self.tmp / f"daemon-{self.port}-{self.lives}.log", "wb"
        )
        opened = (
            functools.partial(trio.lowlevel.open_process, [*CLI, *self.command()])
            if exec_d
            else functools.partial(open_salvor_process, self.command())
        )
        self.process = await opened(env=environment, cwd=REPO, stdout=self._log, stderr=self._log)
        if wait_ready:
            await self.wait_ready()

    async def wait_ready(self) -> list[str]:
        async with trio.open_nursery() as nursery:
            # A daemon that dies before READY fails the test at once, with its log.
            async def watch_exit() -> None:
                code = await self.process.wait()
                raise AssertionError(f"salvor serve exited {code} before READY=1:\n{self.output()}")

            nursery.start_soon(watch_exit)
            seen = await self.notify.wait_for("READY=1")
            nursery.cancel_scope.cancel()
        return seen

    def output(self) -> str:
        self._log.flush()
        return (self.tmp / f"daemon-{self.port}-{self.lives}.log").read_text(errors="replace")

    async def wait_exit(self, timeout: float = WAIT) -> int:
        with trio.fail_after(timeout):
            return await self.process.wait()

    async def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        assert await self.wait_exit() == SIGKILLED

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=WAIT)

    async def cleanup(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            with trio.move_on_after(WAIT):
                await self.process.wait()
        if self.notify is not None:
            self.notify.close()
        if self._log is not None:
            self._log.close()


@pytest.fixture
async def daemons(store_url, tmp_path, providers):
    made: list[Daemon] = []

    def make(**kwargs) -> Daemon:
        daemon = Daemon(
            store_url,
            tmp_path,
            effects=tmp_path / "effects.jsonl",
            endpoints=lambda: [p.base_url for p in providers.started],
            **kwargs,
        )
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        await daemon.cleanup()


@pytest.fixture
def providers():
    started: list[ScriptedProvider] = []
    holds: list[Holds] = []

    def start(script, *, hold: Holds | None = None) -> ScriptedProvider:
        if hold is not None:
            holds.append(hold)
        provider = ScriptedProvider(script, on_call=hold)
        started.append(provider)
        return provider

    start.started = started
    yield start
    for hold in holds:
        hold.release_all()
    for provider in started:
        provider.stop()


def ledger(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def register(client: httpx.AsyncClient, provider: ScriptedProvider, tools) -> str:
    response = await client.post(
        "/v1/agents",
        content=agent_toml(provider.base_url, tools=tools),
        headers={"Content-Type": "application/toml"},
    )
    assert response.status_code in (200, 201), response.text
    return response.json()["agent"]


async def start_run(client: httpx.AsyncClient, agent: str, run_input=None) -> str:
    response = await client.post("/v1/runs", json={"agent": agent, "input": run_input})
    assert response.status_code == 201, response.text
    return response.json()["run"]


async def wait_state(
    client: httpx.AsyncClient, run_id: str, *states: str, timeout: float = WAIT
) -> dict:
    """Poll until the run is in one of ``states`` and no driver holds it."""
    with trio.fail_after(timeout):
        while True:
            body = (await client.get(f"/v1/runs/{run_id}")).json()
            if body["status"]["state"] in states and body.get("driver") != "attached":
                return body
            await trio.sleep(0.05)


def read_log(store_url: str, run_id: str):
    with EventStore.open(store_url) as store:
        return store.read_log(run_id)


async def sound_log(store_url: str, run_id: str):
    """The run's log: contiguous from 0 and legal event by event."""
    log = await trio.to_thread.run_sync(read_log, store_url, run_id)
    assert [envelope.seq for envelope in log] == list(range(len(log)))
    check_batch(EMPTY_VIEW, log)
    return log


def only_repeat_is(provider: ScriptedProvider, interrupted: set[str]) -> None:
    """Every request served once, except the calls that were cut mid-flight: twice."""
    counts = provider.count_by_request_hash()
    assert {h: n for h, n in counts.items() if h in interrupted} == dict.fromkeys(interrupted, 2)
    assert {h: n for h, n in counts.items() if h not in interrupted} == dict.fromkeys(
        set(counts) - interrupted, 1
    )


REFUND_PLAN = [("issue_refund", {"invoice_id": "INV-9", "amount_cents": 500})]
LOOKUP_EMAIL_PLAN = [
    ("lookup_invoice", {"invoice_id": "INV-4"}),
    ("send_email", {"to": "c@example.com", "subject": "About INV-4", "body": "Looked it up."}),
]


# -- (a) restart recovery --------------------------------------------------------------------------


@pytest.mark.kill
async def test_a_killed_daemon_restarts_and_its_runs_continue_by_themselves(
    daemons, providers, tmp_path, store_url
):
    effects = tmp_path / "effects.jsonl"
    daemon = daemons()
    hold = Holds(1)
    refund_provider = providers(tool_loop_script(REFUND_PLAN, final_text="refunded"))
    lookup_provider = providers(
        tool_loop_script(LOOKUP_EMAIL_PLAN, final_text="emailed"), hold=hold
    )

    # Life 1: the daemon dies (a real SIGKILL) inside issue_refund, after its effect.
    await daemon.start(env={"SALVOR_FAULT_KILL_IN_TOOL": "issue_refund"})
    async with daemon.client() as client:
        refund_agent = await register(client, refund_provider, ["issue_refund"])
        parked = await start_run(client, refund_agent, {"invoice": "INV-9"})
        assert await daemon.wait_exit() == SIGKILLED

    # Life 2: recovery probes the open write first: the refund is in the ledger, so its
    # answer settles the write and the run finishes without redoing it. A new run is held
    # inside its second model call, and the test SIGKILLs the daemon there.
    await daemon.start()
    async with daemon.client() as client:
        body = await wait_state(client, parked, "completed")
        lookup_agent = await register(client, lookup_provider, ["lookup_invoice", "send_email"])
        live = await start_run(client, lookup_agent, {"invoice": "INV-4"})
        await hold.wait_reached(1)
    await daemon.kill()
    interrupted = {lookup_provider.calls[1].request_hash}

    # Life 3: no request from the test; the interrupted run finishes by itself.
    await daemon.start()
    async with daemon.client() as client:
        body = await wait_state(client, live, "completed")
        assert body["status"] == {"state": "completed", "output": "emailed"}
        only_repeat_is(lookup_provider, interrupted)
        only_repeat_is(refund_provider, set())  # the probed run went on to its last call
        assert Counter(record["tool"] for record in ledger(effects)) == {
            "issue_refund:sent": 1,
            "issue_refund": 1,
            "lookup_invoice": 1,
            "send_email": 1,
        }
        await sound_log(store_url, live)
        log = await sound_log(store_url, parked)
        [settled] = [e.event for e in log if getattr(e.event, "settled_by", None)]
        assert settled.settled_by == "probe" and settled.probe["tool"] == "lookup_refund"
    assert Counter(record["tool"] for record in ledger(effects))["issue_refund"] == 1


# -- (b) graceful stop -----------------------------------------------------------------------------


async def test_sigterm_with_runs_mid_flight_exits_0_and_the_restart_recovers_them(
    daemons, providers, store_url
):
    daemon = daemons()
    hold = Holds(0, 1, 2)
    provider = providers(tool_loop_script(LOOKUP_EMAIL_PLAN[:1], final_text="looked up"), hold=hold)
    await daemon.start()
    async with daemon.client() as client:
        agent = await register(client, provider, ["lookup_invoice"])
        runs = [await start_run(client, agent, {"n": n}) for n in range(3)]
        for index in range(3):
            await hold.wait_reached(index)
        interrupted = {call.request_hash for call in provider.calls}

        async with client.stream("GET", f"/v1/runs/{runs[0]}/events") as response:
            first = await read_stream(response, stop_after=2)
            daemon.process.send_signal(signal.SIGTERM)
            # The open stream ends with its end frame: the run is left mid-flight, undriven.
            rest = await read_stream(response)
        assert first.seqs == [0, 1] and rest.seqs == []
        assert rest.end == {"status": {"state": "awaiting_model"}, "detached": True}

    assert await daemon.wait_exit() == 0, daemon.output()
    await daemon.notify.wait_for("STOPPING=1")
    hold.release_all()

    await daemon.start()
    async with daemon.client() as client:
        for run_id in runs:
            body = await wait_state(client, run_id, "completed")
            assert body["status"]["output"] == "looked up"
            await sound_log(store_url, run_id)
    only_repeat_is(provider, interrupted)


async def test_a_stop_ends_when_a_driver_waits_on_a_store_that_never_answers(
    server_factory, operator_declarations, monkeypatch, caplog
):
    # Short bounds, in real time: the daemon runs in the test's loop, its store behind threads.
    monkeypatch.setattr(store_access, "WRITER_STOP_SECONDS", 1.0)
    unreached = "http://127.0.0.1:9"  # the drive stops before its model call: nothing listens here
    operator_declarations.provider(unreached)
    server = await server_factory(drain_seconds=1.0)
    store = server.state.runtime.access.store
    agent = await server.register_agent(agent_toml(unreached))
    entered, release, answered = threading.Event(), threading.Event(), threading.Event()
    append_batch = store.append_batch

    def hung(requests):
        # Run heads go through; the driver's first append (its model call's intent) meets a
        # database that takes the write and never answers.
        if any(request.view.next_seq > 0 for request in requests):
            entered.set()
            release.wait(60)
            try:
                return append_batch(requests)
            finally:
                answered.set()
        return append_batch(requests)

    store.append_batch = hung
    try:
        run_id = await server.start_run(agent, {"n": 1})
        assert await trio.to_thread.run_sync(entered.wait, 10)
        await server.stop()  # bounded (30 s) inside: before the drain deadline it never returned
    finally:
        release.set()
        # The abandoned writer's late transaction ends before the store is torn down (a
        # PostgreSQL schema dropped under it deadlocks with it).
        await trio.to_thread.run_sync(answered.wait, 10)
    messages = [record.getMessage() for record in caplog.records]
    assert any("did not drain within 1s" in text and run_id in text for text in messages), messages


# -- (c) the wake sweeper --------------------------------------------------------------------------


def seed_runs(store_url: str) -> dict[str, str]:
    """Runs recorded straight into the store, before the daemon starts."""
    past = format_instant(datetime.now(UTC) - timedelta(minutes=5))
    runs = {
        "orphan": "0a000000-0000-4000-8000-000000000001",  # sleeping, due, its agent is nowhere
        "client_running": "0a000000-0000-4000-8000-000000000002",
        "client_sleeping": "0a000000-0000-4000-8000-000000000003",
    }
    with EventStore.open(store_url) as store:
        _, view = store.append(
            runs["orphan"],
            [RunStarted(agent_def_hash="sha256:" + "0" * 64, input=None)],
            EMPTY_VIEW,
        )
        store.append(runs["orphan"], [SleepStarted(wake_at=past)], view)
        store.append(
            runs["client_running"],
            [RunStarted(agent_def_hash="sha256:" + "1" * 64, input=None, driven_by="client")],
            EMPTY_VIEW,
        )
        _, view = store.append(
            runs["client_sleeping"],
            [RunStarted(agent_def_hash="sha256:" + "1" * 64, input=None, driven_by="client")],
            EMPTY_VIEW,
        )
        store.append(runs["client_sleeping"], [SleepStarted(wake_at=past)], view)
    return runs


async def test_the_wake_sweeper_wakes_due_runs_and_leaves_the_rest(daemons, providers, store_url):
    seeded = await trio.to_thread.run_sync(seed_runs, store_url)
    before = {
        name: len(await trio.to_thread.run_sync(read_log, store_url, run_id))
        for name, run_id in seeded.items()
    }
    # A sweep every quarter second and a one-second nap: the order below is held by the held
    # model call and the counted warnings, not by how long either takes.
    daemon = daemons(wake_interval=0.25)
    hold = Holds(1)
    napper = providers(
        tool_loop_script([("wait_until", {"seconds": 1})], final_text="awake"), hold=hold
    )
    sleeper = providers(tool_loop_script([("wait_until", {"seconds": 3600})], final_text="never"))
    await daemon.start()
    async with daemon.client() as client:
        long_run = await start_run(client, await register(client, sleeper, ["wait_until"]))
        nap_run = await start_run(
            client, await register(client, napper, ["wait_until", "lookup_invoice"])
        )

        # Before its instant, a resume is refused with the deadline as
        # evidence; nothing is recorded.
        body = await wait_state(client, long_run, "sleeping")
        length = len(await trio.to_thread.run_sync(read_log, store_url, long_run))
        response = await client.post(f"/v1/runs/{long_run}/resume")
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "still_sleeping"
        assert error["details"]["wake_at"] == body["status"]["wake_at"]
        assert isinstance(error["details"]["remaining_seconds"], int)
        assert 3500 < error["details"]["remaining_seconds"] <= 3600
        assert len(await trio.to_thread.run_sync(read_log, store_url, long_run)) == length

        # The nap ends; the sweeper (not the test) wakes the run, whose next model call is held.
        await hold.wait_reached(1)
        body = (await client.get(f"/v1/runs/{nap_run}")).json()
        assert body["status"]["state"] == "awaiting_model" and body["driver"] == "attached"
        # While it is being driven, neither a resume nor more sweeps start a second driver.
        for _ in range(2):
            response = await client.post(f"/v1/runs/{nap_run}/resume")
            assert response.status_code == 202, response.text
        # Three more sweeps pass while the call is held: each one warns of the orphan it cannot
        # wake.
        unwoken = f"sleeping run {seeded['orphan']} not woken"
        sweeps = daemon.output().count(unwoken)
        with trio.fail_after(WAIT):
            while daemon.output().count(unwoken) < sweeps + 3:
                await trio.sleep(0.05)
        assert napper.call_count == 2
        hold.release(1)
        body = await wait_state(client, nap_run, "completed")
        assert body["status"]["output"] == "awake"
        only_repeat_is(napper, set())
        await sound_log(store_url, nap_run)

        # The sweep kept going past the run it could not wake, and left the client's runs alone.
        for name, run_id in seeded.items():
            assert (
                len(await trio.to_thread.run_sync(read_log, store_url, run_id)) == before[name]
            ), name
        orphan = (await client.get(f"/v1/runs/{seeded['orphan']}")).json()
        assert orphan["status"]["state"] == "sleeping" and orphan["driver"] == "none"
        assert (await client.get(f"/v1/runs/{long_run}")).json()["status"]["state"] == "sleeping"
    assert f"sleeping run {seeded['orphan']} not woken" in daemon.output()
    assert seeded["client_running"] not in daemon.output()
    assert seeded["client_sleeping"] not in daemon.output()


# -- (d) systemd notify ----------------------------------------------------------------------------


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_systemd_hears_ready_after_the_port_accepts_then_watchdog_and_stopping(daemons):
    daemon = daemons()
    await daemon.start(env={"WATCHDOG_USEC": "200000"}, wait_ready=False, exec_d=True)
    seen = await daemon.wait_ready()
    # READY=1 means the port accepts connections now: no retry, no wait.
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=5):
        pass
    async with daemon.client() as client:
        assert (await client.get("/v1/capabilities")).status_code == 200
    assert all(message == "WATCHDOG=1" for message in seen[:-1])

    pings = 0
    with trio.fail_after(WAIT):
        while pings < 3:
            message = await daemon.notify.receive()
            assert message == "WATCHDOG=1"
            pings += 1

    daemon.process.send_signal(signal.SIGTERM)
    await daemon.notify.wait_for("STOPPING=1")
    assert await daemon.wait_exit() == 0, daemon.output()


# -- (e) refusals at start -------------------------------------------------------------------------


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--auth-token", "SALVOR_TEST_TOKEN_UNSET"], "SALVOR_TEST_TOKEN_UNSET"),
        # A malformed --listen is a usage error (exit 2): tests/daemon/cli/test_unix.py.
        (
            ["--model-endpoint", "api.example.com"],
            "--model-endpoint needs an http:// or https:// URL",
        ),
        (
            ["--model-endpoint", "http://127.0.0.1:9,key_file=/nonexistent/key"],
            "cannot read the key_file",
        ),
        (["--mcp-origin", "https://tools.example.com/mcp"], "--mcp-origin needs an origin"),
        (
            ["--service-origin", "http://127.0.0.1:8765/task"],
            "--service-origin needs an origin",
        ),
    ],
)
async def test_a_bad_start_exits_1_with_one_sentence(store_url, args, names):
    env = {key: value for key, value in os.environ.items() if key != "SALVOR_TEST_TOKEN_UNSET"}
    command = ["serve", "--store", store_url, "--listen", f"127.0.0.1:{free_port()}", *args]
    run = functools.partial(
        run_salvor, command, env=env, cwd=REPO, capture_output=True, text=True, timeout=WAIT
    )
    result = await trio.to_thread.run_sync(run)
    stderr = result.stderr
    assert result.returncode == 1, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("salvor: ") and names in stderr
    assert "Traceback" not in stderr


SHORT_TOKEN = "fifteen-bytes!!"  # 15 bytes: one short of the floor


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("args", "names"),
    [
        # The token itself is never printed; the sentence says how to make a good one.
        (
            ["--auth-token", "SALVOR_TEST_SHORT_TOKEN"],
            (
                "SALVOR_TEST_SHORT_TOKEN, whose token is shorter than 16 bytes; make a good one "
                "with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
            ),
        ),
        (["--trusted-proxy", "proxy.example"], "--trusted-proxy 'proxy.example' is not an IP"),
    ],
)
async def test_a_weak_or_malformed_setting_is_a_usage_error(store_url, args, names):
    env = {**os.environ, "SALVOR_TEST_SHORT_TOKEN": SHORT_TOKEN}
    command = ["serve", "--store", store_url, "--listen", f"127.0.0.1:{free_port()}", *args]
    run = functools.partial(
        run_salvor, command, env=env, cwd=REPO, capture_output=True, text=True, timeout=WAIT
    )
    result = await trio.to_thread.run_sync(run)
    stderr = result.stderr
    assert result.returncode == 2, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("salvor: ") and names in stderr
    assert SHORT_TOKEN not in stderr + result.stdout
    assert "Traceback" not in stderr


def test_a_short_token_is_refused_by_the_config_as_well() -> None:
    # Every way into serve() (an embedding, a test), not only the command line.
    with pytest.raises(ValueError, match="at least 16 bytes") as refused:
        ServeConfig(store_url="sqlite:///unused.db", auth_token=SHORT_TOKEN)
    assert SHORT_TOKEN not in str(refused.value)
    assert ServeConfig(store_url="sqlite:///unused.db", auth_token=SHORT_TOKEN + "!").auth_token
