"""A service agent under a real `salvor serve` that is SIGKILLed while its trigger is in flight.

The service is a real program on the real anthropic SDK, started (as its
wiring contract asks) with ``ANTHROPIC_BASE_URL`` at the agent's proxy port.
The daemon is killed in one of two places:

* ``between_calls``: the service has made its first model call and pauses
  before its second; the daemon dies once that call's completion is recorded
  (the proxy answers the service before it records). No model intent is open.
* ``in_call``: the scripted provider holds the second model call, so its
  intent is open in the log when the daemon dies.

Either way the service's request in flight ends (its next model call finds
nothing on the port) before the daemon is started again. The next daemon
re-drives the run by itself: it binds the port again and POSTs the trigger
again; the proxy answers the first call from the log and goes live. The run
completes; no completed call is served twice (between calls: every distinct
request exactly once; in a call: only the cut one again), and neither the
upstream key nor the trigger's header secret reaches the store or the
daemon's output.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from salvor.protocol import EventKind
from salvor.store import EventStore

from tests.chaos.test_kill_serve import Daemon
from tests.daemon.agents.test_process_agent import PLAN, SECRET
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script
from tests.support.service_agents import free_port, service_definition, start_service

pytestmark = pytest.mark.kill

HEADER_SECRET = "svc-token-SECRET-44d1"


def completed_model_calls(store_url: str, run_id: str) -> int:
    """How many model calls the run's log holds completed, read through a handle of its own."""
    with EventStore.open(store_url) as store:
        log = store.read_log(run_id)
    return sum(1 for envelope in log if envelope.event.KIND is EventKind.MODEL_CALL_COMPLETED)


def wait_until(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# Both cuts on SQLite; on PostgreSQL the one that leaves a model intent open in the log (between
# calls the store holds only completed calls, which the in-call cut's log holds too).
CUTS = [("sqlite", "between_calls"), ("sqlite", "in_call"), ("postgres", "in_call")]


@pytest.mark.parametrize(
    ("store_url", "cut"), CUTS, indirect=["store_url"], ids=["-".join(c) for c in CUTS]
)
def test_sigkill_of_the_daemon_mid_trigger_recovers_the_service_run_by_replay(
    tmp_path: Path, store_url: str, cut: str
) -> None:
    held = threading.Event()

    def on_call(call) -> None:
        if cut == "in_call" and call.index == 1:
            held.wait(30)

    provider = ScriptedProvider(tool_loop_script(PLAN, final_text="settled"), on_call=on_call)
    port = free_port()
    release = tmp_path / "release"
    env = {"RELEASE": str(release)} if cut == "between_calls" else {}
    service = start_service(tmp_path, "anthropic", f"http://127.0.0.1:{port}", env=env)
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.env.update(
        SALVOR_AGENT_UPSTREAM=provider.base_url,
        SALVOR_AGENT_KEY=SECRET,
        SERVICE_TOKEN=HEADER_SECRET,
    )
    daemon.allow_process_agents()
    daemon.args += [
        "--service-origin",
        f"{service.url.removesuffix('/task')},header_env=SERVICE_TOKEN",
    ]
    definition = service_definition(
        service.url, port, headers={"Authorization": "Bearer ${SERVICE_TOKEN}"}
    )
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            response = client.post(
                "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
            )
            assert response.status_code == 201, response.text
            run_id = client.post(
                "/v1/runs", json={"agent": response.json()["agent"], "input": "settle A-1"}
            ).json()["run"]
            if cut == "between_calls":
                wait_until(
                    lambda: service.entries("held"), "the service to pause after its first call"
                )
                # The service has its answer before the completion is durable (the proxy
                # answers, then records): a kill in between leaves the call open, to be issued
                # again. "Between calls" is a kill once it is recorded.
                wait_until(
                    lambda: completed_model_calls(store_url, run_id) == 1,
                    "the first model call's completion to be recorded",
                )
            else:
                provider.wait_for_calls(2, 30)
            daemon.kill()
            release.write_text("go")
            held.set()
            # The cut request ends before the next daemon binds the port, so it
            # cannot interleave its calls with the re-triggered one.
            wait_until(lambda: service.entries("finished"), "the cut request to end")
            assert service.entries("finished")[0]["status"] == 500
            daemon.start()
            deadline = time.monotonic() + 60
            while True:
                body = client.get(f"/v1/runs/{run_id}").json()
                if body["status"]["state"] in ("completed", "failed"):
                    break
                assert time.monotonic() < deadline, body
                time.sleep(0.05)
        assert body["status"]["state"] == "completed", body
        assert body["status"]["output"] == {"reply": "settled", "trigger_status": 200}
        served = sorted(provider.count_by_request_hash().values())
        assert served == ([1, 1, 1] if cut == "between_calls" else [1, 1, 2]), served
        assert {call.api_key for call in provider.calls} == {SECRET}
        triggers = service.entries("trigger")
        assert len(triggers) == 2
        assert {t["headers"]["authorization"] for t in triggers} == {f"Bearer {HEADER_SECRET}"}
        code, _ = daemon.terminate()
        assert code == 0
        for index in range(daemon.starts):
            output = daemon.log(index)
            assert SECRET not in output and HEADER_SECRET not in output
        if store_url.startswith("sqlite:///"):
            db = Path(store_url.removeprefix("sqlite:///"))
            for path in db.parent.glob(db.name + "*"):
                data = path.read_bytes()
                assert SECRET.encode() not in data and HEADER_SECRET.encode() not in data
    finally:
        release.write_text("go")
        held.set()
        if daemon.alive():
            daemon.kill()
        service.stop()
        provider.stop()
