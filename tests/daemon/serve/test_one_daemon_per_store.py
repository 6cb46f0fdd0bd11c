"""Daemons and command lines over one store: real `salvor serve` and `salvor` processes over
one real store (SQLite and PostgreSQL); a command refused beside them is read from
``main(argv)`` in the test's process, holding the store's locks as any other process would.

Several daemons serve one store together. A `salvor resume` beside a daemon is refused in one
sentence naming the daemon, and touches nothing: the daemon's
sleeping process agent lives on and the daemon still answers. A `salvor
run` works beside a live daemon in either order: a daemon starting while it
drives neither kills its agent nor recovers its run. A daemon is refused
while a `salvor resume` drives, and that resume first kills the agent a
SIGKILLed `salvor run` left behind: its owner is provably gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.test_kill_serve import Daemon
from tests.support.cli import salvor_in_process
from tests.support.processes import gone, wait_gone
from tests.support.spawn import run_salvor, salvor_process

REPO = Path(__file__).resolve().parents[3]

# A process agent that records its pid and sleeps until the test lets it go
# (bounded), then ends without a model call: its run then rests failed (a
# process that never called the proxy), which is all these tests need of
# it: it ended, once.
SLEEPER = r"""
import os, sys, time
from pathlib import Path
with open(os.environ["PIDFILE"], "a") as pids:
    pids.write(f"{os.getpid()}\n")
release = Path(os.environ["RELEASE"])
deadline = time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""

# The sleeper again, but the part that stays is a child in a session of its own: the process
# group the tether kills when its salvor dies does not hold it (as a daemonising agent, or one
# whose tether was itself killed, escapes), so only the orphan sweep can end it. Its pid is the
# one recorded. The parent waits for it, so the run still ends when the test lets it go.
ESCAPER = (
    r"""
import os, sys
child = os.fork()
if child:
    os.waitpid(child, 0)
    sys.exit(0)
os.setsid()
"""
    + SLEEPER
)

ENDED = "failed"
NO_MODEL_CALL = "the agent process exited 0 without making any model call"


def sleeper_toml(tmp_path: Path, script_text: str = SLEEPER) -> str:
    script = tmp_path / "sleeper.py"
    script.write_text(script_text)
    return (
        'name = "sleeper"\nkind = "process"\ncommand = '
        f"{json.dumps([sys.executable, str(script)])}\n"
        f"timeout = 60\n[env]\nPIDFILE = {json.dumps(str(tmp_path / 'agent.pids'))}\n"
        f"RELEASE = {json.dumps(str(tmp_path / 'release'))}\n"
    )


def agent_pids(tmp_path: Path, count: int = 1, timeout: float = 30) -> list[int]:
    path = tmp_path / "agent.pids"
    deadline = time.monotonic() + timeout
    while True:
        pids = [int(line) for line in path.read_text().split()] if path.exists() else []
        if len(pids) >= count:
            return pids
        assert time.monotonic() < deadline, f"{count} agent process(es) never started; saw {pids}"
        time.sleep(0.05)


def cli_env(store_url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
    return {**env, "SALVOR_STORE": store_url, "PYTHONUNBUFFERED": "1"}


def salvor(store_url: str, *args: str) -> subprocess.CompletedProcess:
    return run_salvor(
        args, capture_output=True, text=True, env=cli_env(store_url), timeout=60, cwd=REPO
    )


def refused(store_url: str, *args: str) -> subprocess.CompletedProcess:
    """A command expected to be refused beside a live owner: read from main(argv) in this process
    (tests/support/cli), which takes the store's locks as a process of its own would."""
    return salvor_in_process(*args, env=cli_env(store_url), cwd=REPO, timeout=60)


def one_sentence(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode != 0, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("salvor: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def daemon(tmp_path: Path, store_url: str):
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.allow_process_agents()
    try:
        yield daemon
    finally:
        (tmp_path / "release").touch()
        if daemon.alive():
            daemon.kill()


def start_sleeping_run(daemon: Daemon, tmp_path: Path) -> str:
    with daemon.client(timeout=30) as client:
        agent = client.post(
            "/v1/agents",
            content=sleeper_toml(tmp_path),
            headers={"Content-Type": "application/toml"},
        ).json()["agent"]
        return client.post("/v1/runs", json={"agent": agent, "input": "sleep"}).json()["run"]


def test_two_daemons_serve_one_store_and_a_resume_beside_them_is_refused(
    daemon: Daemon, tmp_path: Path, store_url: str
) -> None:
    (tmp_path / "second").mkdir()
    second = Daemon(tmp_path / "second", store_url, tmp_path / "effects.jsonl")
    daemon.start()
    try:
        second.start()
        for each in (daemon, second):
            with each.client(timeout=30) as client:
                assert client.get("/v1/runs").status_code == 200
        one_sentence(refused(store_url, "wake"), "is serving this store")
        assert second.terminate()[0] == 0
    finally:
        if second.alive():
            second.kill()
    assert daemon.terminate()[0] == 0


def test_a_resume_beside_a_daemon_is_refused_and_the_daemons_agent_lives(
    daemon: Daemon, tmp_path: Path, store_url: str
) -> None:
    daemon.start()
    run_id = start_sleeping_run(daemon, tmp_path)
    [agent] = agent_pids(tmp_path)
    resume = refused(store_url, "resume", run_id)
    one_sentence(
        resume,
        f"salvor serve (pid {daemon.proc.pid}, {daemon.base_url})",
        f"{daemon.base_url}/v1/runs/{run_id}/resume",
    )
    assert one_sentence(refused(store_url, "wake"), f"pid {daemon.proc.pid}")
    assert not gone(agent), "a refused command killed the first daemon's agent"
    with daemon.client(timeout=30) as client:
        assert client.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "running"
        (tmp_path / "release").touch()
        deadline = time.monotonic() + 30
        while client.get(f"/v1/runs/{run_id}").json()["status"]["state"] != ENDED:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert agent_pids(tmp_path) == [agent], "the run's agent was started more than once"
    assert daemon.terminate()[0] == 0


def test_a_cli_run_beside_a_live_daemon_completes(daemon: Daemon, store_url: str) -> None:
    daemon.start()
    result = salvor(
        store_url, "run", "contrib/agents/refund-desk.toml", "--input", '{"invoice_id": "INV-7"}'
    )
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.splitlines()[0]
    with daemon.client(timeout=30) as client:
        assert client.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "completed"


def test_a_daemon_starting_beside_a_cli_run_neither_kills_its_agent_nor_recovers_its_run(
    daemon: Daemon, tmp_path: Path, store_url: str
) -> None:
    agent_file = tmp_path / "sleeper.toml"
    agent_file.write_text(sleeper_toml(tmp_path))
    cli = salvor_process(
        ["run", str(agent_file), "--input", '"sleep"'],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(store_url),
        cwd=REPO,
    )
    try:
        run_id = cli.stdout.readline().strip()
        [agent] = agent_pids(tmp_path)
        daemon.start()  # READY: it has swept and recovered by now
        assert not gone(agent), "the starting daemon killed the CLI run's agent"
        assert "(0 interrupted runs to recover)" in daemon.log()
        # Nor does a resume over HTTP drive it a second time: refused, nothing recorded.
        with daemon.client(timeout=30) as client:
            before = client.get(f"/v1/runs/{run_id}").json()
            refused = client.post(f"/v1/runs/{run_id}/resume")
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["code"] == "wrong_state"
            assert refused.json()["error"]["message"].startswith(
                f"run {run_id} is being driven by another salvor process beside this daemon"
            )
            assert client.get(f"/v1/runs/{run_id}").json() == before
        (tmp_path / "release").touch()
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 3, err  # the run ended failed: see SLEEPER
    assert NO_MODEL_CALL in out.splitlines()[-1]
    assert agent_pids(tmp_path) == [agent], "the CLI's run was driven a second time"
    assert daemon.terminate()[0] == 0


def test_a_daemon_is_refused_while_a_resume_drives_which_first_killed_the_dead_clis_agent(
    daemon: Daemon, tmp_path: Path, store_url: str
) -> None:
    agent_file = tmp_path / "sleeper.toml"
    agent_file.write_text(sleeper_toml(tmp_path, ESCAPER))
    cli = salvor_process(
        ["run", str(agent_file), "--input", '"sleep"'],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=cli_env(store_url),
        cwd=REPO,
    )
    resume = None
    try:
        run_id = cli.stdout.readline().strip()
        [orphan] = agent_pids(tmp_path)
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        # Out of the tether's reach (see ESCAPER): it outlives its salvor until a sweep.
        assert not wait_gone(orphan, seconds=1.0)
        resume = salvor_process(
            ["resume", run_id],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(store_url),
            cwd=REPO,
        )
        _, second = agent_pids(tmp_path, 2)
        assert wait_gone(orphan), (
            "the agent of the SIGKILLed salvor run outlived the resume's sweep"
        )
        refused = run_salvor(
            daemon.args, capture_output=True, text=True, env=daemon.env, timeout=60
        )
        one_sentence(refused, f"salvor resume (pid {resume.pid})", "is driving runs in this store")
        assert not gone(second), "the refused daemon killed the resume's agent"
        (tmp_path / "release").touch()
        out, err = resume.communicate(timeout=60)
        assert resume.returncode == 3, err
        assert f"run {run_id} failed: {NO_MODEL_CALL}" in out
    finally:
        for process in (cli, resume):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def test_a_resume_of_a_run_a_live_cli_run_drives_is_refused_naming_it(
    tmp_path: Path, store_url: str
) -> None:
    agent_file = tmp_path / "sleeper.toml"
    agent_file.write_text(sleeper_toml(tmp_path))
    cli = salvor_process(
        ["run", str(agent_file), "--input", '"sleep"'],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=cli_env(store_url),
        cwd=REPO,
    )
    try:
        run_id = cli.stdout.readline().strip()
        [agent] = agent_pids(tmp_path)
        one_sentence(
            refused(store_url, "resume", run_id),
            f"run {run_id} is being driven by salvor run (pid {cli.pid})",
        )
        assert not gone(agent), "the refused resume killed the live run's agent"
        (tmp_path / "release").touch()
        cli.communicate(timeout=60)
        assert agent_pids(tmp_path) == [agent]
    finally:
        (tmp_path / "release").touch()
        if cli.poll() is None:
            cli.kill()
            cli.wait()
