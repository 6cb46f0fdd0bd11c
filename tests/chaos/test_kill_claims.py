"""A keyed write's claim across a SIGKILL: a real `salvor run`, a real MCP server, a real store.

The first run's write (the fixture MCP server's ``write_note``, keyed on its
``text``) reaches the server, which records it in its ledger and holds the
call; the test SIGKILLs the `salvor run` there, between the effect and its
completion. The first run's claim is left open. A second run asking for the
same note must not perform it: it waits out its bound and stops with
nothing of its call written. Once a person resolves the first run's write,
the second run copies that outcome (``deduplicated_from``) and the server
never sees a second call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from salvor.protocol import EventKind, RunState, sha256_hash
from salvor.store import EventStore

from tests.support.cli import salvor_in_process
from tests.support.mcp_servers import FixtureServer
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script
from tests.support.spawn import run_salvor, salvor_process

pytestmark = pytest.mark.kill

# What the test reads or records as a person would (the log, a resolve), no fault aimed at it:
# main(argv) in this process (tests/support/cli). Every run and resume is a process of its own.
READS_AND_RECORDS = ("log", "resolve")
TIMEOUT = 60
NOTE = "refund INV-7"
IDENTITY = sha256_hash({"tool": "write_note", "mcp_server": "fx", "text": NOTE})


def agent_file(path: Path, provider: ScriptedProvider, fx: FixtureServer) -> Path:
    path.write_text(
        'model = "scripted"\n[llm]\nprovider = "anthropic"\n'
        f'base_url = "{provider.base_url}"\nmax_retries = 0\n\n'
        f'[[mcp_servers]]\nname = "fx"\ncommand = {fx.toml_command()}\n'
        'effects = { write_note = "write" }\nidempotency_keys = { write_note = "text" }\n',
        encoding="utf-8",
    )
    return path


def notes(log) -> list:
    return [
        e
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED and e.event.tool == "write_note"
    ]


def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def test_a_second_run_never_performs_a_write_whose_first_was_killed_mid_call(
    tmp_path: Path, store_url: str
) -> None:
    fx_dir = tmp_path / "fx"
    fx_dir.mkdir()
    fx = FixtureServer(fx_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
    env.update(SALVOR_STORE=store_url, PYTHONUNBUFFERED="1", SALVOR_CLAIM_WAIT_SECONDS="0.3")

    def salvor(*args: str) -> subprocess.CompletedProcess:
        if args[0] in READS_AND_RECORDS:
            return salvor_in_process(*args, env=env)
        return run_salvor(args, env=env, capture_output=True, text=True, timeout=TIMEOUT)

    first_provider = ScriptedProvider(
        tool_loop_script([("write_note", {"text": NOTE, "hold": fx.hold("w")})], final_text="a")
    )
    second_provider = ScriptedProvider(
        tool_loop_script([("write_note", {"text": NOTE})], final_text="b")
    )
    try:
        first, second = str(uuid.uuid4()), str(uuid.uuid4())
        first_agent = agent_file(tmp_path / "first.toml", first_provider, fx)
        second_agent = agent_file(tmp_path / "second.toml", second_provider, fx)

        # The first run's write lands on the server; the run dies before recording it.
        child = salvor_process(
            ["run", str(first_agent), "--run-id", first],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: fx.calls_of("write_note"), "the write to reach the server")
            os.kill(child.pid, signal.SIGKILL)
            child.communicate(timeout=TIMEOUT)
        finally:
            if child.poll() is None:
                child.kill()
        fx.release("w")
        with EventStore.open(store_url) as store:
            claim = store.claims.get_claim(IDENTITY)
            assert (claim.run_id, claim.state) == (first, "open")

        # The second run meets the open claim: it performs nothing and writes no intent.
        stopped = salvor("run", str(second_agent), "--run-id", second)
        assert stopped.returncode != 0, stopped
        assert f"run {first}" in stopped.stderr + stopped.stdout, stopped
        assert len(fx.calls_of("write_note")) == 1
        with EventStore.open(store_url) as store:
            assert not notes(store.read_log(second))

        # Recovery of the first run: the write's outcome is unknown, so it parks for a person.
        resumed = salvor("resume", first)
        with EventStore.open(store_url) as store:
            assert store.read_view(first).state is RunState.NEEDS_RECONCILIATION, resumed
        resolved = salvor("resolve", first, "--output", json.dumps({"noted": NOTE}))
        assert resolved.returncode == 0, resolved

        # Now the second run copies the resolved outcome; the server still saw one call.
        done = salvor("resume", second)
        assert done.returncode == 0, done
        assert len(fx.calls_of("write_note")) == 1
        with EventStore.open(store_url) as store:
            assert store.read_view(second).state is RunState.COMPLETED
            log = store.read_log(second)
            claim = store.claims.get_claim(IDENTITY)
        (intent,) = notes(log)
        (copied,) = [
            e.event
            for e in log
            if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
        ]
        assert intent.event.idempotency_key == IDENTITY
        assert copied.output == {"noted": NOTE}
        assert copied.deduplicated_from == {"run_id": first, "seq": claim.seq}
        assert (claim.run_id, claim.state) == (first, "settled")
    finally:
        first_provider.stop()
        second_provider.stop()
