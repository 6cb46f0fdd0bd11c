"""Kill safety of an MCP server attached at run time to a process agent's run: a real `salvor
serve` with ``--attachable-mcp`` and ``--allow-process-agents``, SIGKILLed twice, the fixture MCP
server over streamable HTTP outliving it, the agent the stand-in suite's ``mcp`` SDK script on
the ``salvor`` MCP server.

The daemon dies as the run's head is durable, so the run rests never driven; the operator
attaches ``desk`` over the store (``salvor tools attach --mcp``). The next daemon recovers the
run: it lists the server through the log, the agent lists its tools and writes through the
``salvor`` lane, and the daemon is killed after the server performed the write and before its
completion was recorded. The daemon after that probes the write with the server's declared read
and settles it: performed once, never sent again, and neither the server's URL nor its secret in
the log.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
from salvor.protocol import EventKind
from salvor.store import EventStore

from tests.chaos.test_kill_attached_mcp import DESK_TOKEN, serving_desk
from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log, wait_state
from tests.daemon.agents.test_process_agent import SECRET
from tests.daemon.proxies.test_salvor_server import salvor_agent, steps_script
from tests.support.mcp_servers import FixtureServer, HttpFixtureServer
from tests.support.scripted_provider import ScriptedProvider
from tests.support.spawn import run_salvor

pytestmark = pytest.mark.kill


@pytest.fixture
def desk(tmp_path: Path):
    """The fixture server over streamable HTTP, its write probed by ``find_note``."""
    fx_dir = tmp_path / "fx"
    fx_dir.mkdir()
    fx = FixtureServer(fx_dir)
    http = HttpFixtureServer(fx, "--find-note")
    try:
        yield fx, http
    finally:
        http.stop()


def only_run(store_url: str) -> str:
    with EventStore.open(store_url) as store:
        (summary,) = store.list_runs()[0]
    return summary.run_id


def test_a_process_agents_attached_write_killed_after_it_landed_is_settled_by_its_probe(
    tmp_path: Path, store_url: str, desk
) -> None:
    fx, http = desk
    note = {"text": "INV-7", "hold": fx.hold("w")}
    script = steps_script(lambda _: ("write_note", note), lambda results: f"noted: {results[0]}")
    with ScriptedProvider(script) as provider:
        daemon = serving_desk(tmp_path, store_url, http, provider)
        daemon.allow_process_agents()
        daemon.env.update(
            SALVOR_AGENT_UPSTREAM=provider.base_url,
            SALVOR_AGENT_KEY=SECRET,
            SALVOR_FAULT_KILL_AFTER_SEQ="0",
        )
        try:
            daemon.start()
            with daemon.client(timeout=30) as client:
                registered = client.post(
                    "/v1/agents",
                    content=salvor_agent(tmp_path).stored_text,
                    headers={"Content-Type": "application/toml"},
                )
                assert registered.status_code == 201, registered.text
                try:
                    client.post(
                        "/v1/runs", json={"agent": registered.json()["agent"], "input": "x"}
                    )
                except httpx.HTTPError:
                    pass  # the daemon died before it answered
            assert daemon.proc.wait(timeout=SETTLE_SECONDS) == -signal.SIGKILL, daemon.log()
            del daemon.env["SALVOR_FAULT_KILL_AFTER_SEQ"]
            run_id = only_run(store_url)
            attached = run_salvor(
                [
                    "tools",
                    "attach",
                    run_id,
                    "--mcp",
                    "desk",
                    "--attachable-mcp",
                    str(tmp_path / "attachable.toml"),
                    "--store",
                    store_url,
                ],
                capture_output=True,
                timeout=60,
            )
            assert attached.returncode == 0, attached.stderr

            daemon.start()
            # The server has performed the write and holds the answer back: the daemon dies
            # between the write's intent and its completion.
            deadline = time.monotonic() + SETTLE_SECONDS
            while not fx.calls_of("write_note"):
                assert time.monotonic() < deadline, (
                    f"the write never reached the server\n{daemon.log()}"
                )
                time.sleep(0.02)
            daemon.kill()
            fx.release("w")
            daemon.start()
            with daemon.client(timeout=30) as client:
                body = wait_state(client, run_id, "completed")
        finally:
            daemon.kill()

    assert body["status"]["output"]["reply"] == "noted: noted INV-7", body
    assert len(fx.calls_of("write_note")) == 1
    assert [c["arguments"] for c in fx.calls_of("find_note")] == [{"text": "INV-7"}]
    log = stored_log(store_url, run_id)
    calls = [e for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]
    assert [e.event.tool for e in calls][:2] == ["mcp:desk/tools/list", "mcp:salvor/initialize"]
    # Listed once: the daemon after the second kill offered the listing its log holds.
    assert [e.event.tool for e in calls].count("mcp:desk/tools/list") == 1
    (intent,) = [e for e in calls if e.event.input.get("name") == "write_note"]
    assert intent.event.effect == "write"
    (done,) = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    assert done.settled_by == "probe"
    # The secret went to the server as the daemon connected, never into the log.
    assert {r["authorization"] for r in fx.http_requests} == {f"Bearer {DESK_TOKEN}"}
    assert DESK_TOKEN not in repr(log) and http.url not in repr(log)
