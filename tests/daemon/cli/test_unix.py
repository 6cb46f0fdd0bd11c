"""The `salvor` command line behaves like a Unix tool, in real processes with real pipes.

* A reader that closes the pipe early (``salvor log RUN | head -1``) ends the command quietly:
  nothing on stderr, and the command's own exit status (0 for a read; ``salvor run`` still
  drives its run to rest and says how it ended through its status).
* A value a flag cannot take is a usage error: one line on stderr, exit status 2, nothing
  opened.
* ``--json`` is honoured by ``log`` and ``serve``.
* A port ``serve`` cannot bind (``--listen``, ``--proxy-port``) is one sentence naming it.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from salvor.store import EventStore

from tests.support import spawn
from tests.support.backends import SQLITE_ONLY
from tests.support.cli import salvor_in_process
from tests.support.runtime import agent_toml
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is the processes' pipes and statuses.
STORE_BACKENDS = SQLITE_ONLY

REPO = Path(__file__).resolve().parents[3]
# The smallest pipe Linux makes (a page): a log of a few kilobytes outgrows it, so the
# command is still writing when the reader leaves, whatever the machine's default pipe size.
PIPE_BYTES = 4096
TOOL_CALLS = 40  # 160 events: a log far longer than the pipe holds


def environment(store_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_FAULT_")}
    return {**env, "SALVOR_STORE": store_url}


def first_line_then_close(
    args: list[str], env: dict[str, str], *, closed: threading.Event | None = None
) -> tuple[str, int, str]:
    """``salvor ARGS | head -1``: read one line from a small pipe, close it, let the command
    end. Its first line, exit status and stderr."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    try:
        process = spawn.salvor_process(
            args, stdout=write_end, stderr=subprocess.PIPE, env=env, cwd=REPO
        )
    finally:
        os.close(write_end)
    line = b""
    try:
        while not line.endswith(b"\n"):
            byte = os.read(read_end, 1)
            assert byte, f"the command wrote no whole line: {line!r}"
            line += byte
    finally:
        os.close(read_end)
        if closed is not None:
            closed.set()
    _, err = process.communicate(timeout=120)
    return line.decode(), process.returncode, err.decode()


@pytest.fixture
def long_run(store_url: str, tmp_path: Path, providers) -> str:
    """A completed run whose log is a few times longer than the pipe holds."""
    provider = providers(
        tool_loop_script(
            [("lookup_invoice", {"invoice_id": f"INV-{n}"}) for n in range(TOOL_CALLS)],
            final_text="looked them all up",
        )
    )
    agent = tmp_path / "agent.toml"
    agent.write_text(agent_toml(provider.base_url, tools=["lookup_invoice"]))
    done = salvor_in_process("run", str(agent), env=environment(store_url), cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[0]


@pytest.mark.parametrize(
    "args",
    [["history"], ["history", "--json"], ["log"], ["log", "--json"]],
    ids=["history", "history-json", "log", "log-json"],
)
def test_a_read_whose_reader_leaves_ends_quietly(store_url, long_run, args):
    with EventStore.open(store_url) as store:
        assert len(store.read_log(long_run)) > 4 * TOOL_CALLS
    line, status, stderr = first_line_then_close(
        [args[0], long_run, *args[1:]], environment(store_url)
    )
    assert status == 0 and stderr == "", (status, stderr)
    first = json.loads(line) if "--json" in args else line
    assert (first["seq"] == 0) if "--json" in args else (" RunStarted " in first), first


def test_a_run_whose_reader_leaves_after_its_id_is_still_driven_to_rest(
    store_url, tmp_path, providers
):
    # `salvor run AGENT --json | head -n 1 | pick run`, as the README starts runs: the reader
    # leaves with the id, before the run's first model call is answered.
    closed = threading.Event()
    provider = providers(
        tool_loop_script([("lookup_invoice", {"invoice_id": "INV-7"})], final_text="done"),
        on_call=lambda call: closed.wait(60),
    )
    agent = tmp_path / "agent.toml"
    agent.write_text(agent_toml(provider.base_url, tools=["lookup_invoice"]))
    line, status, stderr = first_line_then_close(
        ["run", str(agent), "--json"], environment(store_url), closed=closed
    )
    assert status == 0 and stderr == "", (status, stderr)
    run_id = json.loads(line)["run"]
    replay = salvor_in_process("replay", run_id, "--dry-run", env=environment(store_url))
    assert json.loads(replay.stdout)["status"]["state"] == "completed"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["run", "contrib/agents/refund-desk.toml", "--label", "nokv"],
            ["--label 'nokv'", "key=value"],
        ),
        (["serve", "--listen", "8420"], ["--listen '8420'", "HOST:PORT"]),
        (["serve", "--listen", "127.0.0.1:99999"], ["--listen", "HOST:PORT"]),
        (["serve", "--proxy-port", "http"], ["--proxy-port 'http'", "0 (a free one) to 65535"]),
        (["serve", "--wake-interval", "-5"], ["--wake-interval '-5'"]),
        (
            ["serve", "--allow-host", "salvor.example.com:443"],
            ["--allow-host takes a host name", "without a port", "'salvor.example.com:443'"],
        ),
        (["serve", "--allow-host", "*.localhost"], ["--allow-host takes", "'*.localhost'"]),
        (
            ["serve", "--allow-origin", "https://ops.example.com/app"],
            ["--allow-origin takes an origin", "no path", "'https://ops.example.com/app'"],
        ),
        (
            ["run", "contrib/agents/refund-desk.toml", "--input", "not json"],
            ["--input is not valid JSON"],
        ),
        (["resume", "not-a-run"], ["'not-a-run' is not a run id"]),
        (["resolve", "00000000-0000-4000-8000-000000000000", "--output", "{"], ["--output"]),
        (["runs", "--limit", "lots"], ["--limit must be a positive whole number"]),
        (["runs", "--state", "asleep"], ["'asleep' is not a run state"]),
        (["reconcile", "--not-landed"], ["--output and --not-landed settle one run"]),
        (["replay", "00000000-0000-4000-8000-000000000000"], ["--dry-run"]),
        (["resolve", "00000000-0000-4000-8000-000000000000"], ["--output"]),
    ],
)
def test_a_value_its_flag_cannot_take_is_a_usage_error(tmp_path, args, fragments):
    store = tmp_path / "salvor.db"
    EventStore.open(f"sqlite:///{store}").close()
    before = sorted(tmp_path.iterdir())
    result = spawn.run_salvor(
        args,
        capture_output=True,
        text=True,
        env=environment(f"sqlite:///{store}"),
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("salvor: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""
    assert sorted(tmp_path.iterdir()) == before


def test_log_json_is_an_object_per_event_then_the_status(store_url, long_run):
    result = salvor_in_process("log", long_run, "--json", env=environment(store_url))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    with EventStore.open(store_url) as store:
        log = store.read_log(long_run)
    assert [line["seq"] for line in lines[:-1]] == [envelope.seq for envelope in log]
    assert lines[0]["kind"] == "RunStarted" and "RunStarted" in lines[0]["line"]
    assert lines[0]["recorded_at"] == log[0].recorded_at
    assert lines[-1] == {
        "run": long_run,
        "status": {"state": "completed", "output": "looked them all up"},
    }


def test_serve_json_says_where_it_listens_and_logs_json_lines(tmp_path):
    env = environment(f"sqlite:///{tmp_path / 'salvor.db'}")
    process = spawn.salvor_process(
        ["serve", "--json", "--listen", "127.0.0.1:0", "--wake-interval", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
        text=True,
    )
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "salvor serve --json printed nothing on stdout within 60 s"
        started = json.loads(process.stdout.readline())
        assert started["pid"] == process.pid
        (url,) = started["listening"]
        with socket.create_connection(tuple(url.removeprefix("http://").rsplit(":", 1))):
            pass
    finally:
        process.terminate()
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert out == ""
    records = [json.loads(line) for line in err.splitlines()]
    assert any("salvor serving on" in record["message"] for record in records), err


def test_serve_on_a_busy_proxy_port_is_one_sentence(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = spawn.run_salvor(
            ["serve", "--listen", "127.0.0.1:0", "--proxy-port", str(port)],
            capture_output=True,
            text=True,
            env=environment(f"sqlite:///{tmp_path / 'salvor.db'}"),
            cwd=REPO,
            timeout=120,
        )
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"the model proxy cannot listen on 127.0.0.1:{port}" in lines[0]
    assert "--proxy-port" in lines[0]
