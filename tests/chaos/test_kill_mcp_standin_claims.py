"""A process agent's keyed MCP call across a SIGKILL of a real `salvor serve`.

The agent (the ``mcp`` SDK through ``$SALVOR_MCP_SERVER_FIX``) asks for one
keyed note (``write_note``, keyed on its ``text``). The fixture server holds
the call at the instant under test and the daemon is SIGKILLed there:

* between intent and effect: the call reached the server, which has not
  performed it (``hold_before``);
* between effect and completion: the server performed it, the daemon never
  recorded the answer (``hold``).

The server honours ``_meta.salvor.idempotency_key`` as a payment API does
(``--honour-keys``), and writes down every call that reached it. After the
restart the invariants are: every call that reached the server carried the
one identity as its key; the identity was performed once; a second run
asking for the same note copies the first's result (``deduplicated_from``)
and never reaches the server. A keyed ``write`` cut off between effect and
completion parks its run; a second run then stops with nothing written until
a person resolves the first, and then, with nobody resuming it, copies what the
person recorded.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from salvor.protocol import RunState
from salvor.store import EventStore

from tests.chaos.test_kill_process_agent import wait_terminal
from tests.chaos.test_kill_serve import Daemon
from tests.daemon.agents.test_process_agent import SECRET
from tests.daemon.proxies.test_mcp_standin_claims import IDENTITY, NOTE, calls_of, keyed_agent
from tests.support.mcp_servers import FixtureServer
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script

pytestmark = pytest.mark.kill


def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


class Setup:
    """A daemon, the scripted model and the fixture server of one test."""

    def __init__(self, tmp_path: Path, store_url: str, effect: str, hold: str) -> None:
        self.tmp_path, self.store_url = tmp_path, store_url
        self.fx = FixtureServer(tmp_path / "fx")
        self.fx.dir.mkdir()
        note = {"text": NOTE, hold: self.fx.hold("w")}
        self.provider = ScriptedProvider(tool_loop_script([("write_note", note)], final_text="ok"))
        self.daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
        self.daemon.env.update(
            SALVOR_AGENT_UPSTREAM=self.provider.base_url,
            SALVOR_AGENT_KEY=SECRET,
            SALVOR_CLAIM_WAIT_SECONDS="0.3",
        )
        self.daemon.allow_process_agents()
        self.definition = keyed_agent(
            tmp_path, self.fx, effect=effect, server_args=("--honour-keys",)
        ).stored_text

    def register(self, client: httpx.Client) -> str:
        return client.post(
            "/v1/agents", content=self.definition, headers={"Content-Type": "application/toml"}
        ).json()["agent"]

    def log(self, run_id: str):
        with EventStore.open(self.store_url) as store:
            return store.read_log(run_id)

    def stop(self) -> None:
        if self.daemon.alive():
            self.daemon.kill()
        self.provider.stop()


def wait_state(client: httpx.Client, run_id: str, state: str, timeout: float = 60) -> dict:
    return wait_for(
        lambda: (
            (body := client.get(f"/v1/runs/{run_id}").json())["status"]["state"] == state
            and body.get("driver") != "attached"
            and body
        ),
        f"run {run_id} to be {state}",
        timeout,
    )


# Both windows on SQLite; on PostgreSQL the one whose claim stays open over a performed effect
# (the keyed write below is the other claim the store keeps across the kill there).
WINDOWS = [("sqlite", "intent-effect"), ("sqlite", "effect-completion")] + [
    ("postgres", "effect-completion")
]


@pytest.mark.parametrize(
    ("store_url", "window"), WINDOWS, indirect=["store_url"], ids=["-".join(w) for w in WINDOWS]
)
def test_a_keyed_idempotent_call_killed_mid_call_is_performed_once_under_its_identity(
    tmp_path: Path, store_url: str, window: str
) -> None:
    hold = "hold_before" if window == "intent-effect" else "hold"
    setup = Setup(tmp_path, store_url, "idempotent", hold)
    fx, daemon = setup.fx, setup.daemon
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            agent = setup.register(client)
            first = client.post("/v1/runs", json={"agent": agent, "input": "note it"}).json()["run"]
            if window == "intent-effect":
                wait_for(lambda: fx.received_of("write_note"), "the call to reach the server")
                assert fx.calls_of("write_note") == []
            else:
                wait_for(lambda: fx.calls_of("write_note"), "the server to perform the call")
            daemon.kill()
            fx.release("w")
            # The new daemon recovers the run by itself: the open idempotent call runs again.
            daemon.start()
            assert wait_terminal(client, first)["status"]["state"] == "completed"
            received = fx.received_of("write_note")
            assert len(received) == 2, received
            assert all(
                r["meta"] == {"salvor": {"idempotency_key": IDENTITY, "run_id": first}}
                for r in received
            )
            # Performed once: the server collapsed the retry by its key.
            assert len(fx.calls_of("write_note")) == 1

            second = client.post("/v1/runs", json={"agent": agent, "input": "note it"}).json()[
                "run"
            ]
            assert wait_terminal(client, second)["status"]["state"] == "completed"
            assert len(fx.received_of("write_note")) == 2  # the copy never reached the server
        [(seq_a, _, done_a)] = calls_of(setup.log(first), "write_note")
        [(_, intent_b, done_b)] = calls_of(setup.log(second), "write_note")
        assert intent_b.idempotency_key == IDENTITY
        assert done_b.deduplicated_from == {"run_id": first, "seq": seq_a}
        assert done_b.output == {"result": done_a.output["result"]}
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        setup.stop()


def test_a_keyed_write_killed_after_its_effect_parks_and_holds_off_a_second_run(
    tmp_path: Path, store_url: str
) -> None:
    setup = Setup(tmp_path, store_url, "write", "hold")
    fx, daemon = setup.fx, setup.daemon
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            agent = setup.register(client)
            first = client.post("/v1/runs", json={"agent": agent, "input": "note it"}).json()["run"]
            wait_for(lambda: fx.calls_of("write_note"), "the server to perform the write")
            daemon.kill()
            fx.release("w")
            daemon.start()
            # An open write is never performed again: the run waits for a person.
            wait_state(client, first, "needs_reconciliation")

            # A second run meets the open claim, waits its bound and stops writing nothing.
            second = client.post("/v1/runs", json={"agent": agent, "input": "note it"}).json()[
                "run"
            ]
            wait_for(lambda: setup.log(second)[-1].kind == "ModelCallCompleted", "the model call")
            body = wait_state(client, second, "running")
            assert calls_of(setup.log(second), "write_note") == [], body
            assert len(fx.received_of("write_note")) == 1

            resolved = {"result": {"content": [{"type": "text", "text": f"noted {NOTE}"}]}}
            answer = client.post(f"/v1/runs/{first}/resolve", json={"output": resolved})
            assert answer.status_code == 200, answer.text
            # Nobody resumes the second run: the resolve's commit settles the claim it stopped
            # on, and the daemon drives it on by itself.
            assert wait_terminal(client, second)["status"]["state"] == "completed"
            assert len(fx.received_of("write_note")) == 1 and len(fx.calls_of("write_note")) == 1
        [(seq_a, _, _)] = calls_of(setup.log(first), "write_note")
        [(_, _, done_b)] = calls_of(setup.log(second), "write_note")
        assert done_b.output == resolved
        assert done_b.deduplicated_from == {"run_id": first, "seq": seq_a}
        with EventStore.open(store_url) as store:
            claim = store.claims.get_claim(IDENTITY)
            assert store.read_view(first).state is not RunState.NEEDS_RECONCILIATION
        assert (claim.run_id, claim.state) == (first, "settled")
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        setup.stop()
