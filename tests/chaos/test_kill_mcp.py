"""A built-in agent's MCP call in flight when a real `salvor serve` is SIGKILLed.

The agent's tools are the fixture MCP server (stdio, spawned by the daemon;
or streamable HTTP, a server of its own that outlives the daemon). The run
looks a key up, then makes a call the server holds open after writing its
ledger line (the effect has started), then looks another key up. The daemon
is killed while the held call is open and started again; it recovers the run
by itself:

* a held ``write`` may or may not have landed, so the run parks in
  needs_reconciliation; the operator records what the ledger shows, resumes,
  and the run completes without the write ever running again;
* a held ``read`` is executed again on a new session, and the run completes.

Either way the completed lookup before the kill ran once, and every model
call was served once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.chaos.test_kill_serve import Daemon
from tests.support.mcp_servers import FixtureServer, HttpFixtureServer
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script

pytestmark = pytest.mark.kill


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of the dead daemon is reparented and reaped; a zombie counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


# Every effect and transport on SQLite; on PostgreSQL each effect once and each transport once:
# the store sees a parked write or a re-executed read the same whichever way the call travelled.
KILLS = [
    ("sqlite", effect, transport) for effect in ("write", "read") for transport in ("stdio", "http")
] + [("postgres", "write", "stdio"), ("postgres", "read", "http")]


@pytest.mark.parametrize(
    ("store_url", "effect", "transport"),
    KILLS,
    indirect=["store_url"],
    ids=["-".join(kill) for kill in KILLS],
)
def test_sigkill_with_an_mcp_call_in_flight(
    tmp_path: Path, store_url: str, transport: str, effect: str
) -> None:
    fx_dir = tmp_path / "fx"
    fx_dir.mkdir()
    fx = FixtureServer(fx_dir)
    held = "write_note" if effect == "write" else "lookup"
    held_args = (
        {"text": "held", "hold": fx.hold("h")}
        if effect == "write"
        else {"key": "held", "hold": fx.hold("h")}
    )
    plan = [("lookup", {"key": "before"}), (held, held_args), ("lookup", {"key": "after"})]
    provider = ScriptedProvider(tool_loop_script(plan, final_text="settled"))
    http = HttpFixtureServer(fx) if transport == "http" else None
    # A stdio server that ignores the end of its stdin: only its tether to the daemon ends it.
    location = (
        f"command = {fx.toml_command('--linger')}\n" if http is None else f'url = "{http.url}"\n'
    )
    definition = (
        'model = "scripted-model"\n[llm]\nprovider = "anthropic"\n'
        f'base_url = "{provider.base_url}"\nmax_retries = 0\n\n[[mcp_servers]]\nname = "fx"\n'
        f'{location}effects = {{ lookup = "read", write_note = "write" }}\n'
    )
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.allow_process_agents()
    daemon.args += ["--model-endpoint", provider.base_url]
    if http is not None:
        daemon.args += ["--mcp-origin", f"http://127.0.0.1:{http.port}"]
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            response = client.post(
                "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
            )
            assert response.status_code == 201, response.text
            agent = response.json()["agent"]
            run_id = client.post("/v1/runs", json={"agent": agent, "input": "go"}).json()["run"]
            wait_for(
                lambda: any(e["arguments"].get("hold") for e in fx.ledger), "the held call to start"
            )
            daemon.kill()
            fx.release("h")
            if http is None:
                for pid in [s["pid"] for s in fx.starts]:
                    wait_for(
                        lambda pid=pid: not alive(pid),
                        f"the server {pid} to die with the daemon",
                        5,
                    )
            daemon.start()

            def resting():
                body = client.get(f"/v1/runs/{run_id}").json()
                return (
                    body
                    if body["status"]["state"] in ("completed", "failed", "needs_reconciliation")
                    else None
                )

            body = wait_for(resting, "the recovered run to rest")
            if effect == "write":
                assert body["status"]["state"] == "needs_reconciliation", body
                assert body["pending"]["tool"] == "write_note"
                # What the ledger shows happened is what the operator records.
                assert len(fx.calls_of("write_note")) == 1
                response = client.post(
                    f"/v1/runs/{run_id}/resolve",
                    json={"output": {"content": [{"type": "text", "text": "noted held"}]}},
                )
                assert response.status_code == 200, response.text
                # The daemon drives the resolved run on by itself.
                body = wait_for(
                    lambda: (b := resting()) and b["status"]["state"] == "completed" and b,
                    "the resolved run to complete",
                )
            assert body["status"] == {"state": "completed", "output": "settled"}, body
        code, _ = daemon.terminate()
        assert code == 0
        keys = [e["arguments"].get("key") or e["arguments"].get("text") for e in fx.ledger]
        if effect == "write":
            assert keys == ["before", "held", "after"]  # the cut write never ran again
        else:
            assert keys == [
                "before",
                "held",
                "held",
                "after",
            ]  # the cut read ran once more, nothing else did
        assert sorted(provider.count_by_request_hash().values()) == [1, 1, 1, 1]
    finally:
        fx.release("h")
        if daemon.alive():
            daemon.kill()
        if http is not None:
            http.stop()
        for start in fx.starts:
            try:
                os.kill(start["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        provider.stop()
