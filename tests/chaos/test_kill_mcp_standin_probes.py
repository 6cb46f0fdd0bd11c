"""A process agent's probed MCP write across a SIGKILL of a real `salvor serve`.

The agent (the ``mcp`` SDK through ``$SALVOR_MCP_SERVER_FIX``) asks for one
keyed note (``write_note``), a write whose server declares a probe: the
fixture server's ``find_note``, a read of its ledger. The server holds the
write at the instant under test and the daemon is SIGKILLed there. The next
daemon finds the run parked on the open write and drives it by itself: the
agent's replay reaches the call, and while it waits the daemon probes the
write over the server's lane.

* Killed after the effect (``hold``): the probe finds the note; its answer
  is the write's recorded output (``settled_by: "probe"``), the agent is
  answered with it, and the server saw the write once.
* Killed between the intent and the effect (``hold_before``): the probe finds
  nothing; the write is sent again under its recorded key, and the server,
  which honours keys as a payment API does, performs it once.

Either way the run completes with no resume and no resolve by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from salvor.protocol import EventKind
from salvor.store import EventStore

from tests.chaos.test_kill_mcp_standin_claims import Setup, wait_for
from tests.chaos.test_kill_process_agent import wait_terminal
from tests.daemon.proxies.test_mcp_standin_claims import IDENTITY, NOTE, calls_of
from tests.support.mcp_standin_agents import standin_agent

pytestmark = pytest.mark.kill

PROBED = (
    'idempotency_keys = { write_note = "text" }\n'
    "[mcp_servers.probes.write_note]\n"
    'tool = "find_note"\ninput = { text = "text" }\nlanded = "found"\noutput = "note"\n'
)


def probed_setup(tmp_path: Path, store_url: str, hold: str) -> Setup:
    setup = Setup(tmp_path, store_url, "write", hold)
    setup.definition = standin_agent(
        tmp_path,
        f"command = {setup.fx.toml_command('--honour-keys', '--find-note')}\n",
        effects='effects = { write_note = "write", find_note = "read" }\n',
        server_extra=PROBED,
    ).stored_text
    return setup


def probe_answer(setup: Setup, run_id: str, seq: int):
    with EventStore.open(setup.store_url) as store:
        return store.claims.probe_answers([(run_id, seq)]).get((run_id, seq))


def open_write_seq(setup: Setup, run_id: str) -> int:
    [(seq, _, done)] = calls_of(setup.log(run_id), "write_note")
    assert done is None
    return seq


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_write_killed_after_its_effect_is_settled_by_its_probe_on_restart(
    tmp_path: Path, store_url: str
) -> None:
    setup = probed_setup(tmp_path, store_url, "hold")
    fx, daemon = setup.fx, setup.daemon
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            agent = setup.register(client)
            run = client.post("/v1/runs", json={"agent": agent, "input": "note it"}).json()["run"]
            wait_for(lambda: fx.calls_of("write_note"), "the server to perform the write")
            daemon.kill()
            fx.release("w")
            seq = open_write_seq(setup, run)
            daemon.start()
            assert wait_terminal(client, run)["status"]["state"] == "completed"
        [(_, intent, done)] = calls_of(setup.log(run), "write_note")
        assert intent.idempotency_key == IDENTITY
        assert done.settled_by == "probe"
        assert done.output == {"result": {"content": [{"type": "text", "text": f"noted {NOTE}"}]}}
        assert done.probe["tool"] == "find_note" and done.probe["input"] == {"text": NOTE}
        assert probe_answer(setup, run, seq).verdict == "landed"
        # The write reached the server once; the probe was the restart's only call of it.
        assert len(fx.received_of("write_note")) == len(fx.calls_of("write_note")) == 1
        assert len(fx.calls_of("find_note")) == 1
        with EventStore.open(store_url) as store:
            claim = store.claims.get_claim(IDENTITY)
        assert (claim.run_id, claim.seq, claim.state) == (run, seq, "settled")
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        setup.stop()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_write_killed_before_its_effect_is_sent_again_once_when_its_probe_finds_nothing(
    tmp_path: Path, store_url: str
) -> None:
    setup = probed_setup(tmp_path, store_url, "hold_before")
    fx, daemon = setup.fx, setup.daemon
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            agent = setup.register(client)
            run = client.post("/v1/runs", json={"agent": agent, "input": "note it"}).json()["run"]
            wait_for(lambda: fx.received_of("write_note"), "the write to reach the server")
            daemon.kill()
            seq = open_write_seq(setup, run)
            daemon.start()
            # The probe answers first (nothing landed); only then is the held write let go.
            wait_for(lambda: probe_answer(setup, run, seq), "the restart's probe")
            fx.release("w")
            assert wait_terminal(client, run)["status"]["state"] == "completed"
        assert probe_answer(setup, run, seq).verdict == "not_landed"
        [(_, _, done)] = calls_of(setup.log(run), "write_note")
        assert done.settled_by is None
        assert done.output == {"result": {"content": [{"type": "text", "text": f"noted {NOTE}"}]}}
        # Sent again under its recorded key, and performed once.
        received = fx.received_of("write_note")
        assert len(received) == 2, received
        assert {r["meta"]["salvor"]["idempotency_key"] for r in received} == {IDENTITY}
        assert len(fx.calls_of("write_note")) == 1
        kinds = [e.event.KIND for e in setup.log(run)]
        assert kinds.count(EventKind.TOOL_CALL_COMPLETED) == len(
            [e for e in setup.log(run) if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]
        )
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        setup.stop()
