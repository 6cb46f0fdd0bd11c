"""What one caller can make a real `salvor serve` store is bounded; each refusal names its limit.

* The issue's reproduction: one client-driven run appending megabyte events as fast as it can
  (it wrote 97 MiB in 1.9 s) is refused at the default per-run byte limit with ``413
  quota_exceeded`` naming the limit and its flag; nothing of the refused batch is stored, and
  the client's own ending still fits. On SQLite and PostgreSQL.
* Each limit's flag changes it: a smaller ``--max-payload-bytes`` caps the request body, a
  smaller ``--max-run-bytes`` and ``--max-run-events`` refuse a client run sooner, and a
  server-driven run whose model answer is over the payload limit fails with a sentence naming it.
* The free-space floor, on a small tmpfs of the test's own (root only; skipped elsewhere, naming
  why): once the store's filesystem is below ``--min-free-bytes``, a new run, a registration and
  a new client run are refused ``507 insufficient_storage`` while the run already going
  completes; a lower floor takes new work again.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from tests.chaos.test_kill_serve import Daemon
from tests.chaos.test_store_faults import (  # noqa: F401 -- small_disk is a fixture
    CALLER,
    _wait_for,
    agent_toml,
    small_disk,
)
from tests.support.client_events import envelope, run_started
from tests.support.scripted_provider import ProviderCall, ScriptedProvider, text_reply

MIB = 1024 * 1024
BOUND = 60.0


class ClientRun:
    """One client-driven run over HTTP: its id, its drive token, the next seq."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        opened = http.post("/v1/client-runs", json={})
        assert opened.status_code in (200, 201), opened.text
        self.run_id = opened.json()["run"]
        self.token = opened.json()["drive_token"]
        self.seq = 0

    def append(self, events: list[tuple[str, dict]]) -> httpx.Response:
        body = {
            "events": [
                envelope(self.run_id, self.seq + n, kind, payload)
                for n, (kind, payload) in enumerate(events)
            ]
        }
        answer = self.http.post(
            f"/v1/client-runs/{self.run_id}/events",
            json=body,
            headers={"X-Drive-Token": self.token},
        )
        if answer.status_code == 200:
            self.seq += len(events)
        return answer

    def start(self) -> None:
        head = run_started(self.run_id, "sha256:" + "a" * 64)["event"]["payload"]
        answer = self.append([("RunStarted", head)])
        assert answer.status_code == 200, answer.text

    def state(self) -> dict:
        return self.http.get(f"/v1/runs/{self.run_id}").json()


def gate_and_answer(pad: int) -> list[tuple[str, dict]]:
    """A gate and its answer, the answer carrying ``pad`` bytes: about ``pad`` stored bytes."""
    return [
        ("Suspended", {"reason": "more", "input_schema": {"type": "object"}}),
        ("Resumed", {"input": {"pad": "x" * pad}}),
    ]


def _daemon(tmp_path: Path, store_url: str, *flags: str) -> tuple[Daemon, httpx.Client]:
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.args += list(flags)
    daemon.start()
    return daemon, httpx.Client(base_url=daemon.base_url, timeout=60)


def test_the_issue_s_client_run_is_refused_at_the_default_byte_limit(tmp_path, store_url) -> None:
    daemon, http = _daemon(tmp_path, store_url)
    try:
        run = ClientRun(http)
        run.start()
        batch = gate_and_answer(MIB) * 6  # 6 MiB, under the 8 MiB body limit
        sent = refused = None
        for sent in range(1, 17):  # up to 96 MiB, the issue's 97 MiB run
            answer = run.append(batch)
            if answer.status_code != 200:
                refused = answer
                break
        assert refused is not None, "a client run stored 96 MiB with no quota refusing it"
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded"
        assert "limit of 67108864 bytes per run (salvor serve --max-run-bytes)" in error["message"]
        assert error["details"]["limit"] == "max_run_bytes"
        # Ten batches fit in 64 MiB, the eleventh does not; nothing of it was stored.
        assert sent == 11
        assert run.state()["event_count"] == 1 + 10 * len(batch)
        # The client's own ending still fits, and then the run is over.
        ended = run.append([("RunFailed", {"error": "my log is full"})])
        assert ended.status_code == 200, ended.text
        assert run.state()["status"]["state"] == "failed"
    finally:
        daemon.terminate()
        http.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_each_limit_is_the_flag_s_and_a_driven_run_fails_naming_it(tmp_path, store_url) -> None:
    provider = ScriptedProvider(lambda call: text_reply("y" * (100 * 1024)))
    daemon, http = _daemon(
        tmp_path,
        store_url,
        "--model-endpoint",
        provider.base_url,
        "--max-payload-bytes",
        "64KiB",
        "--max-run-bytes",
        "256KiB",
        "--max-run-events",
        "40",
    )
    try:
        # The request body's cap is the payload limit.
        run = ClientRun(http)
        run.start()
        over = run.append(gate_and_answer(100 * 1024))
        assert over.status_code == 413, over.text
        assert over.json()["error"]["code"] == "payload_too_large"
        assert "(salvor serve --max-payload-bytes)" in over.json()["error"]["message"]
        # The run's bytes: 30 KiB answers fit eight times in 256 KiB, not nine.
        taken = 0
        while (answer := run.append(gate_and_answer(30 * 1024))).status_code == 200:
            taken += 1
        assert taken == 8, answer.text
        assert answer.json()["error"]["code"] == "quota_exceeded"
        assert "limit of 262144 bytes per run (salvor serve --max-run-bytes)" in answer.text
        # The run's events: a head and 39 more, then no more.
        counted = ClientRun(http)
        counted.start()
        small = [("NowObserved", {"now": "2026-01-01T00:00:00.000000Z"})]
        assert counted.append(small * 39).status_code == 200
        answer = counted.append(small)
        assert answer.status_code == 413 and answer.json()["error"]["code"] == "quota_exceeded"
        assert "limit of 40 per run (salvor serve --max-run-events)" in answer.text

        # A server-driven run whose model answer is over the payload limit fails, naming it.
        registered = http.post(
            "/v1/agents",
            content=agent_toml(provider.base_url),
            headers={"content-type": "application/toml"},
        )
        assert registered.status_code == 201, registered.text
        started = http.post("/v1/runs", json={"agent": registered.json()["agent"], "input": {}})
        assert started.status_code == 201, started.text
        run_id = started.json()["run"]
        status = _wait_for(
            "the driven run failing",
            lambda: (
                (s := http.get(f"/v1/runs/{run_id}").json()["status"])["state"] == "failed" and s
            ),
            daemon,
        )
        assert "over the limit of 65536 bytes per payload" in status["error"], status
        assert "(salvor serve --max-payload-bytes)" in status["error"], status
        assert provider.call_count == 1
    finally:
        daemon.terminate()
        http.close()
        provider.stop()


def _leave_free(directory: Path, free: int) -> None:
    """Fill ``directory``'s filesystem until about ``free`` bytes are left."""
    stats = os.statvfs(directory)
    take = stats.f_bavail * stats.f_frsize - free
    with open(directory / "filler", "wb") as filler:
        while take > 0:
            chunk = min(take, MIB)
            filler.write(b"\0" * chunk)
            take -= chunk


def test_below_the_free_space_floor_new_work_is_refused_and_running_work_finishes(
    request, tmp_path
) -> None:
    disk = request.getfixturevalue("small_disk")
    held = threading.Event()

    def on_call(call: ProviderCall) -> None:
        if call.index == 0:
            held.wait(BOUND)

    provider = ScriptedProvider(lambda call: text_reply("settled"), on_call=on_call)
    store = f"sqlite:///{disk / 'salvor.db'}"
    daemon, http = _daemon(
        tmp_path, store, "--model-endpoint", provider.base_url, "--min-free-bytes", "8MiB"
    )
    try:
        registered = http.post(
            "/v1/agents",
            content=agent_toml(provider.base_url),
            headers={"content-type": "application/toml"},
        )
        assert registered.status_code == 201, registered.text
        agent = registered.json()["agent"]
        going = http.post("/v1/runs", json={"agent": agent, "input": {"case": "going"}})
        assert going.status_code == 201, going.text
        run_id = going.json()["run"]
        _wait_for("the run's model call reaching the provider", lambda: provider.call_count, daemon)

        _leave_free(disk, 4 * MIB)
        refused = http.post(
            "/v1/runs",
            json={"agent": agent, "input": {"case": "new"}, "run_id": str(uuid.uuid4())},
        )
        assert refused.status_code == 507, refused.text
        error = refused.json()["error"]
        assert error["code"] == "insufficient_storage"
        assert "floor of 8388608 bytes" in error["message"]
        assert "(salvor serve --min-free-bytes)" in error["message"]
        again = http.post(
            "/v1/agents",
            content=agent_toml(provider.base_url).replace("faults", "another"),
            headers={"content-type": "application/toml"},
        )
        assert again.status_code == 507, again.text
        client = ClientRun(http)
        head = run_started(client.run_id, agent)["event"]["payload"]
        answer = client.append([("RunStarted", head)])
        assert answer.status_code == 507, answer.text
        assert answer.json()["error"]["code"] == "insufficient_storage"

        # The run already going is running work: its answer is recorded and it completes.
        held.set()
        _wait_for(
            "the running run completing below the floor",
            lambda: http.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "completed",
            daemon,
        )
        listed = http.get("/v1/runs").json()["runs"]
        assert [entry["run"] for entry in listed] == [run_id]
    finally:
        held.set()
        daemon.terminate()
        http.close()

    # A lower floor takes new work again on the same filesystem.
    daemon, http = _daemon(
        tmp_path, store, "--model-endpoint", provider.base_url, "--min-free-bytes", "1MiB"
    )
    try:
        taken = http.post("/v1/runs", json={"agent": agent, "input": {"case": "lower floor"}})
        assert taken.status_code == 201, taken.text
    finally:
        daemon.terminate()
        http.close()
        provider.stop()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_process_agent_s_answer_over_the_payload_limit_fails_its_run(tmp_path, store_url) -> None:
    """The answer reaches the loopback model proxy, whose record of it is refused: the run fails
    naming the limit, the agent's call is answered 413, and its process is stopped."""
    provider = ScriptedProvider(lambda call: text_reply("z" * (100 * 1024)))
    token = "t" * 32
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.env.update(SALVOR_AGENT_UPSTREAM=provider.base_url, SALVOR_TEST_TOKEN=token)
    daemon.args += ["--allow-process-agents", "--auth-token", "SALVOR_TEST_TOKEN"]
    daemon.args += ["--max-payload-bytes", "64KiB"]
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    definition = (
        f'kind = "process"\ncommand = {json.dumps([sys.executable, str(script)])}\ntimeout = 120\n'
    )
    daemon.start()
    http = httpx.Client(
        base_url=daemon.base_url, timeout=60, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        registered = http.post(
            "/v1/agents", content=definition, headers={"content-type": "application/toml"}
        )
        assert registered.status_code == 201, registered.text
        started = http.post("/v1/runs", json={"agent": registered.json()["agent"], "input": "go"})
        assert started.status_code == 201, started.text
        run_id = started.json()["run"]
        status = _wait_for(
            "the process run failing",
            lambda: (
                (s := http.get(f"/v1/runs/{run_id}").json()["status"])["state"]
                in ("failed", "completed")
                and s
            ),
            daemon,
        )
        assert status["state"] == "failed", status
        assert "over the limit of 65536 bytes per payload" in status["error"], status
        assert "(salvor serve --max-payload-bytes)" in status["error"], status
        assert provider.call_count == 1
        # The agent's call was answered (413, naming the limit), not cut by a traceback.
        assert "Traceback" not in daemon.log(), daemon.log()
    finally:
        daemon.terminate()
        http.close()
        provider.stop()
