"""What a process agent gets from the daemon that started it, and what it cannot get.

* Its environment is an allow-list of the daemon's plus what salvor
  injects: a secret under the variable ``--auth-token`` names, or under any
  other name, does not reach it, and openai-agents' tracer is off.
* A real ``salvor serve`` and its agent run as one unprivileged user (root
  reads any ``/proc``): the agent cannot read the daemon's
  ``/proc/<pid>/environ`` or ``mem``.
* A SIGKILLed daemon takes its agents (and their children) with it, at once,
  and an agent outlives the thread that started it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.agents._process_environment import agent_environment
from salvor.daemon.mcp._definition import McpServerSpec
from salvor.daemon.mcp._stdio_transport import server_environment
from salvor.daemon.processes._child_env import TELEMETRY_OFF
from salvor.daemon.processes._spawn import tethered

from tests.support.processes import gone, wait_gone
from tests.support.spawn import ONE_PROCESS

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process hardening is Linux's prctl and /proc"
)

SALVOR = [sys.executable, "-m", "salvor.daemon.cli"]
TOKEN_VAR, TOKEN = "DESK_API_TOKEN", "tok-DESK-5e1b77c04a9d"
OTHER_VAR, OTHER = "VENDOR_BILLING_KEY", "sk-vendor-SECRET-0c41"
DAEMON_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/desk",
    "LANG": "C.UTF-8",
    "LC_TIME": "C",
    TOKEN_VAR: TOKEN,
    OTHER_VAR: OTHER,
    "SALVOR_AGENT_KEY": "sk-upstream",
    "ANTHROPIC_AUTH_TOKEN": "sk-ant",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "HTTPS_PROXY": "http://user:pw@proxy:3128",
    "PYTHONPATH": "/elsewhere",
}


def _agent(env: dict[str, str] | None = None, servers: str = "") -> object:
    table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (env or {}).items())
    return parse_definition(
        f'kind = "process"\ncommand = ["agent"]\n{servers}[env]\n{table}', "toml"
    )


def test_an_agent_gets_the_allow_list_the_injection_and_its_own_env_nothing_else():
    env = agent_environment(
        _agent({"EXTRA": "x"}),
        "run-1",
        {"task": 1},
        "http://127.0.0.1:9/r/cap",
        DAEMON_ENV,
        {"salvor": "/run/relays/SALVOR"},
    )
    injected = {
        "OPENAI_BASE_URL",
        "OPENAI_API_BASE",
        "OPENAI_BASE",
        "ANTHROPIC_BASE_URL",
        "SALVOR_LLM_PROXY",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "SALVOR_PROMPT",
        "SALVOR_INPUT",
        "SALVOR_RUN_ID",
        # The daemon's own MCP server (the flow tools), reached like any declared one.
        "SALVOR_MCP_URL_SALVOR",
        "SALVOR_MCP_SERVER_SALVOR",
    }
    assert set(env) == {"PATH", "HOME", "LANG", "LC_TIME", "EXTRA", *injected, *TELEMETRY_OFF}
    assert (
        env["PATH"] == DAEMON_ENV["PATH"]
        and env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] == "salvor-placeholder"
    )
    assert env["OPENAI_AGENTS_DISABLE_TRACING"] == "1"


def test_a_definition_may_switch_tracing_back_on_and_replace_an_allowed_variable():
    env = agent_environment(
        _agent({"OPENAI_AGENTS_DISABLE_TRACING": "0", "PATH": "/opt/bin"}),
        "r",
        "x",
        "http://127.0.0.1:9/r/cap",
        DAEMON_ENV,
    )
    assert env["OPENAI_AGENTS_DISABLE_TRACING"] == "0" and env["PATH"] == "/opt/bin"


def test_a_stdio_mcp_server_gets_the_allow_list_and_its_own_env_nothing_else():
    spec = McpServerSpec(name="fs", command=("server",), env={"ROOT": "/srv"})
    env = server_environment(spec, DAEMON_ENV)
    assert set(env) == {"PATH", "HOME", "LANG", "LC_TIME", "ROOT", *TELEMETRY_OFF}


UNDUMPABLE = r"""
import ctypes, subprocess, sys
from salvor.daemon.processes._hardening import make_undumpable

PR_GET_DUMPABLE = 3
libc = ctypes.CDLL(None)
made = make_undumpable()
child = subprocess.run(
    [
        sys.executable,
        "-I",
        "-S",
        "-c",
        "import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))",
    ],
    capture_output=True,
    text=True,
)
print(made, libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), child.stdout.strip())
"""


def test_the_daemon_process_is_not_dumpable_and_what_it_execs_is_again():
    # In a process of its own: the flag would stay on pytest's process.
    shown = subprocess.run(
        [sys.executable, "-c", UNDUMPABLE], capture_output=True, text=True, check=True
    ).stdout.split()
    assert shown == ["True", "0", "1"]  # the orphan sweep reads a (dumpable) agent's environ


# -- a real daemon and its agent as one unprivileged user ------------------------------------------

PROBE = r"""
import json, os, sys
from pathlib import Path
daemon = os.getppid()
found = {"env": dict(os.environ), "daemon": daemon, "uid": os.getuid()}
for name in ("environ", "mem"):
    try:
        f = open(f"/proc/{daemon}/{name}", "rb")  # mem opens only for who may ptrace the daemon
    except OSError as exc:
        found[name] = type(exc).__name__
    else:
        found[name] = "opened"
        f.close()
Path(sys.argv[1]).write_text(json.dumps(found))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, what: str, seconds: float):
    deadline = time.monotonic() + seconds
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.fixture
def shared_dir():
    """A directory the unprivileged user can write (tmp_path's parents are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="salvor-containment-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _unprivileged() -> list[str]:
    if os.geteuid() != 0:
        pytest.skip(
            "needs root to start the daemon as another, unprivileged "
            "user (root itself reads any /proc)"
        )
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to drop to an unprivileged user")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("needs a `nobody` user to run the daemon as")
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]


def _runnable(drop: list[str], python: str) -> bool:
    return (
        subprocess.run(
            [*drop, "/bin/sh", "-c", f'exec "{python}" -c pass'], capture_output=True, check=False
        ).returncode
        == 0
    )


def _python_for(drop: list[str]) -> tuple[str, list[str]]:
    """A Python the unprivileged user can start, and how it starts salvor with this venv's packages.

    This venv's interpreter may live under root's home, where the user cannot
    follow it; then a system python3 of the same version gets the venv's
    site-packages (editable install included) by ``site.addsitedir``, and none
    of its own.
    """
    if _runnable(drop, sys.executable):
        return sys.executable, [sys.executable, "-m", "salvor.daemon.cli"]
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    same = system and subprocess.run(
        [system, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip() == str(tuple(sys.version_info[:2]))
    if not (same and _runnable(drop, system)):
        pytest.skip(
            "needs a Python the unprivileged user may run: this venv's lives where it cannot "
            "reach, and there is no "
            f"python{sys.version_info.major}.{sys.version_info.minor} in /usr/bin"
        )
    packages = next(p for p in sys.path if p.endswith("site-packages"))
    boot = (
        f"import site, sys; site.addsitedir({packages!r}); from "
        "salvor.daemon.cli import main; sys.exit(main())"
    )
    return system, [system, "-S", "-c", boot]  # -S: none of the system's own packages


def test_a_same_user_agent_sees_no_daemon_secret_and_cannot_read_its_proc(shared_dir, store_url):
    drop = _unprivileged()
    python, salvor = _python_for(drop)
    if store_url.startswith("sqlite:///"):
        store_url = f"sqlite:///{shared_dir / 'salvor.db'}"
    probe, found = shared_dir / "probe.py", shared_dir / "found.json"
    probe.write_text(PROBE)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SALVOR_", "NOTIFY_"))}
    env.update({TOKEN_VAR: TOKEN, OTHER_VAR: OTHER, "HOME": str(shared_dir)})
    daemon = subprocess.Popen(
        [
            *drop,
            *salvor,
            "serve",
            *ONE_PROCESS,
            "--listen",
            f"127.0.0.1:{port}",
            "--store",
            store_url,
            "--auth-token",
            TOKEN_VAR,
            "--allow-process-agents",
            "--wake-interval",
            "0",
        ],
        env=env,
        cwd=shared_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def listening() -> bool:
            assert daemon.poll() is None, daemon.stderr.read().decode(errors="replace")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        _wait(listening, "the daemon to listen", 60)
        definition = (
            f'kind = "process"\ncommand = {json.dumps([python, str(probe), str(found)])}\n'
            "timeout = 30\n"
        )
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30
        ) as client:
            answer = client.post(
                "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
            )
            assert answer.status_code == 201, answer.text
            answer = client.post(
                "/v1/runs", json={"agent": answer.json()["agent"], "input": "probe"}
            )
            assert answer.status_code in (200, 201, 202), answer.text
            run_id = answer.json()["run"]
            try:
                seen = json.loads(
                    _wait(lambda: found.exists() and found.read_text(), "the probe's findings", 60)
                )
            except AssertionError:
                raise AssertionError(client.get(f"/v1/runs/{run_id}").text) from None
    finally:
        daemon.kill()
        daemon.wait()
        daemon.stderr.close()
    assert seen["daemon"] == daemon.pid and seen["uid"] == pwd.getpwnam("nobody").pw_uid
    leaked = sorted(
        k for k, v in seen["env"].items() if TOKEN in v or OTHER in v or k in (TOKEN_VAR, OTHER_VAR)
    )
    # One comparison, so a failure shows every hole at once: no secret in the agent's
    # environment, tracing off, and the daemon's /proc closed to its own user.
    assert {
        "leaked": leaked,
        "tracing off": seen["env"].get("OPENAI_AGENTS_DISABLE_TRACING"),
        "open environ": seen["environ"],
        "open mem": seen["mem"],
    } == {
        "leaked": [],
        "tracing off": "1",
        "open environ": "PermissionError",
        "open mem": "PermissionError",
    }


# -- agents die with the daemon --------------------------------------------------------------------

SLEEPER = r"""
import os, subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
Path(sys.argv[1]).write_text(f"{os.getpid()} {child.pid}")
time.sleep(120)
"""


def test_a_sigkilled_daemon_takes_its_sleeping_agent_and_the_agent_s_child_with_it(
    tmp_path, store_url
):
    pids_file = tmp_path / "pids"
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SALVOR_", "NOTIFY_"))}
    env[TOKEN_VAR] = TOKEN  # a daemon that runs programs listens on TCP only with a token
    daemon = subprocess.Popen(
        [
            *SALVOR,
            "serve",
            *ONE_PROCESS,
            "--listen",
            f"127.0.0.1:{port}",
            "--store",
            store_url,
            "--auth-token",
            TOKEN_VAR,
            "--allow-process-agents",
            "--wake-interval",
            "0",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:

        def listening() -> bool:
            assert daemon.poll() is None, "salvor serve exited before it listened"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        _wait(listening, "the daemon to listen", 60)
        command = [sys.executable, str(tmp_path / "sleeper.py"), str(pids_file)]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30
        ) as client:
            agent = client.post(
                "/v1/agents",
                content=f'kind = "process"\ncommand = {json.dumps(command)}\ntimeout = 120\n',
                headers={"Content-Type": "application/toml"},
            ).json()["agent"]
            assert client.post("/v1/runs", json={"agent": agent, "input": "sleep"}).status_code in (
                200,
                201,
                202,
            )
            pids = [
                int(p)
                for p in _wait(
                    lambda: pids_file.exists() and pids_file.read_text(), "the agent", 60
                ).split()
            ]
        assert not any(gone(pid) for pid in pids)
        daemon.kill()
        daemon.wait()
        assert wait_gone(pids[0]), "the agent outlived its SIGKILLed daemon"
        assert wait_gone(pids[1]), "the agent's child outlived the SIGKILLed daemon"
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_tethered_process_outlives_the_thread_that_started_it(tmp_path):
    # A parent-death signal would fire here: the kernel sends it when the forking *thread* exits,
    # and trio forks from cached worker threads that exit when idle.
    started: list[subprocess.Popen] = []
    read_end, write_end = os.pipe()

    def start() -> None:
        started.append(
            subprocess.Popen(tethered(["sleep", "60"], write_end), pass_fds=(write_end,))
        )

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    os.close(write_end)
    try:
        assert os.read(read_end, 16) == b""  # the exec happened
        assert not wait_gone(started[0].pid, 1), "the process died with the thread that started it"
        assert started[0].poll() is None
    finally:
        os.close(read_end)
        started[0].kill()
        started[0].wait()
