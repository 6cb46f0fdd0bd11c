"""contrib/sdk/README.md's code, run as its reader would run it: each ``python`` block as a
script in a process of its own, against a real daemon (the scripted provider behind
SALVOR_MODEL_BASE_URL, the demo tools, the example's declared client tool), with only the
daemon's address changed. The client-driven run is driven twice: the second pass is answered from
the log, paying for no model call."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import trio
from salvor.daemon.client_runs._client_tools import load_declarations

from tests.support.backends import SQLITE_ONLY
from tests.support.scripted_provider import text_reply

# The README drives routes whose store behaviour other suites hold on both backends.
STORE_BACKENDS = SQLITE_ONLY

SDK = Path(__file__).resolve().parents[3] / "contrib" / "sdk"
README_ADDRESS = "http://127.0.0.1:8420"
REPLY = "Order o-17 has shipped with DHL; invoice INV-1001 is paid."


def readme_blocks() -> list[str]:
    text = (SDK / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)


@pytest.fixture
def declarations():
    return load_declarations([str(SDK / "example" / "lookup_order.toml")])


async def test_the_sdk_readme_runs_against_a_real_daemon(
    server_factory, providers, declarations, monkeypatch
) -> None:
    provider = providers([text_reply(REPLY)])
    monkeypatch.setenv("SALVOR_MODEL_BASE_URL", provider.base_url)
    server = await server_factory(client_tools=declarations)
    drive, graphs, live, refusals = readme_blocks()

    async def run(code: str, *args: str) -> str:
        assert README_ADDRESS in code
        script = code.replace(README_ADDRESS, server.url)
        env = {**os.environ, "PYTHONPATH": str(SDK)}
        with trio.fail_after(60):
            done = await trio.run_process(
                [sys.executable, "-c", script, *args],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=env,
            )
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    first = await run(drive)
    run_id = first.split()[1]
    assert first.splitlines()[-1] == REPLY
    log = (await server.client.get(f"/v1/client-runs/{run_id}/log")).json()["log"]
    kinds = [envelope["event"]["kind"] for envelope in log]
    assert kinds == [
        "RunStarted",
        "ToolCallRequested",
        "ToolCallCompleted",
        "ToolCallRequested",
        "ToolCallCompleted",
        "ModelCallRequested",
        "ModelCallCompleted",
        "RunCompleted",
    ]
    # Run again on the same run: every step answered from the log, nothing recorded or paid twice.
    again = await run(drive, run_id)
    assert again.splitlines() == [f"run {run_id}", REPLY]
    assert provider.call_count == 1
    assert (await server.client.get(f"/v1/client-runs/{run_id}/log")).json()["log"] == log

    shown = (await run(graphs)).splitlines()
    assert shown[0] == "valid: True" and shown[1].startswith("graph run ")
    assert shown[2:] == ["[('lookup', 'exited')]", "forks so far: []"]

    watched = (await run(live, run_id)).splitlines()
    assert watched == [f"{seq} {kind}" for seq, kind in enumerate(kinds)] + ["rests as completed"]

    assert (await run(refusals)).splitlines()[0] == "404 unknown_graph"
