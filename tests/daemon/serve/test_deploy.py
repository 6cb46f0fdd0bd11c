"""The deployment files: systemd units, the nginx site, the curl walkthrough.

* ``systemd-analyze verify`` passes on both units, with no warning (skipped
  where systemd is not installed). The unit's ExecStart names an installed
  ``salvor``; the test points it at the one next to this interpreter.
* The system unit's ExecStart, run the way systemd runs it (its Environment=,
  a ``STATE_DIRECTORY``, a ``NOTIFY_SOCKET``, ``WATCHDOG_USEC``), with and
  without the kernel's memory-deny-write-execute (``PR_SET_MDWE``, what
  ``MemoryDenyWriteExecute=yes`` asks for): READY=1, the store in the state
  directory, a run driven to the end, WATCHDOG=1 pings, and on SIGTERM
  STOPPING=1 and exit 0 well inside the unit's TimeoutStopSec.
* ``nginx -t`` accepts the site (skipped where nginx is not installed).
* ``contrib/curl/walkthrough.sh`` exits 0 against a real ``salvor serve
  --demo-tools`` with a bearer token, directly and through nginx running the
  site.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from tests.daemon.serve.test_lifecycle import NotifySocket, free_port

REPO = Path(__file__).resolve().parents[3]
UNITS = REPO / "systemd"
SITE = REPO / "contrib" / "nginx" / "salvor.conf"
WALKTHROUGH = REPO / "contrib" / "curl" / "walkthrough.sh"
WAIT = 60
DAEMON_GRACEFUL_SECONDS = 10  # ServeConfig.shutdown_seconds
TOKEN = "deploy-test-token"

# Sets PR_SET_MDWE (refuse memory that is writable and executable, or
# becomes executable) on this process, then runs the salvor CLI in it.
# Exit 77: the kernel does not offer it (before Linux 6.3).
MDWE_WRAPPER = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_MDWE, PR_GET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 66, 1
if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
    sys.exit(77)
assert libc.prctl(PR_GET_MDWE, 0, 0, 0, 0) == PR_MDWE_REFUSE_EXEC_GAIN
from salvor.daemon.cli import main
sys.exit(main(sys.argv[1:]))
"""


def salvor_executable() -> str:
    """The installed ``salvor`` script of the interpreter running the tests."""
    beside = Path(sys.executable).parent / "salvor"
    if beside.exists():
        return str(beside)
    found = shutil.which("salvor")
    if found is None:
        pytest.skip("no installed `salvor` script (pip install -e .)")
    return found


def service_settings(unit: Path) -> dict[str, list[str]]:
    """The [Service] section's settings, each key with every value it was given."""
    settings: dict[str, list[str]] = {}
    section = None
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def with_exec_start(unit: Path, executable: str) -> str:
    """The unit's text with ExecStart's program replaced by ``executable``."""
    return re.sub(
        r"^ExecStart=\S+", lambda _: f"ExecStart={executable}", unit.read_text(), flags=re.MULTILINE
    )


def expand_command(line: str, env: dict[str, str]) -> list[str]:
    """systemd's ExecStart substitution: ``${X}`` is one word, a bare
    ``$X`` word splits on whitespace."""
    argv: list[str] = []
    for word in shlex.split(line):
        if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):
            argv.extend(env.get(word[1:], "").split())
        else:
            argv.append(
                re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m[1], ""), word)
            )
    return argv


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(s|min)?", value)
    assert match, f"unexpected time span {value!r}"
    return int(match[1]) * (60 if match[2] == "min" else 1)


# -- systemd ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("unit", ["salvor.service", "salvor-user.service"])
def test_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    copy = tmp_path / "salvor.service"
    copy.write_text(with_exec_start(UNITS / unit, salvor_executable()))
    env = dict(os.environ)
    command = [analyze, "verify", str(copy)]
    if unit == "salvor-user.service":
        (tmp_path / "runtime").mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(tmp_path / "runtime")  # the user manager wants one
        command.insert(1, "--user")
    result = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=WAIT, env=env
    )
    # verify exits 0 even for an unknown key or an unparsable value; it only
    # warns. So any output at all fails the test.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )


def test_system_unit_settings() -> None:
    service = service_settings(UNITS / "salvor.service")
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "StateDirectory": "salvor",
        "Restart": "on-failure",
        "DynamicUser": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "NoNewPrivileges": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "SystemCallArchitectures": "native",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "EnvironmentFile": "-/etc/salvor/env",
    }
    assert {key: service.get(key, [None])[-1] for key in expected} == expected
    assert seconds(service["WatchdogSec"][-1]) == 30
    assert seconds(service["TimeoutStopSec"][-1]) > DAEMON_GRACEFUL_SECONDS
    user = service_settings(UNITS / "salvor-user.service")
    assert user["Type"] == ["notify"] and user["StateDirectory"] == ["salvor"]
    assert seconds(user["TimeoutStopSec"][-1]) > DAEMON_GRACEFUL_SECONDS


@asynccontextmanager
async def running(
    argv: list[str], env: dict[str, str], log: Path, notify: NotifySocket | None = None
):
    """A subprocess, killed on the way out if it is still alive; with
    ``notify``, entered once READY=1."""
    output = await trio.to_thread.run_sync(open, log, "wb")
    process = await trio.lowlevel.open_process(
        argv, env=env, cwd=REPO, stdout=output, stderr=output
    )
    try:
        if notify is not None:
            async with trio.open_nursery() as nursery:

                async def died() -> None:
                    await process.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(died)
                await notify.wait_for("READY=1", timeout=WAIT)
                nursery.cancel_scope.cancel()
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            with trio.move_on_after(WAIT):
                await process.wait()
        output.close()


@pytest.mark.parametrize("mdwe", [False, True], ids=["plain", "memory-deny-write-execute"])
async def test_system_unit_runs_the_daemon_as_systemd_would(mdwe: bool, tmp_path: Path) -> None:
    service = service_settings(UNITS / "salvor.service")
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "SALVOR_STORE"}
    for assignment in service.get("Environment", []):
        key, _, value = assignment.partition("=")
        env[key] = value
    state_directory = tmp_path / "state"
    state_directory.mkdir()
    notify = NotifySocket()
    env.update(
        # What /etc/salvor/env would say, and what systemd itself hands the service.
        SALVOR_LISTEN=f"127.0.0.1:{port}",
        SALVOR_SERVE_FLAGS="--demo-tools --wake-interval 0",
        STATE_DIRECTORY=str(state_directory),
        NOTIFY_SOCKET=notify.path,
        WATCHDOG_USEC="200000",  # the unit says 30 s; a test does not wait that long for a ping
        HOME=str(tmp_path / "home"),
    )
    argv = expand_command(service["ExecStart"][-1], env)
    assert argv[1:] == [
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--demo-tools",
        "--wake-interval",
        "0",
    ]
    argv[0] = salvor_executable()
    if mdwe:
        argv[:1] = [sys.executable, "-c", MDWE_WRAPPER]
    log = tmp_path / "daemon.log"
    try:
        async with running(argv, env, log, notify) as process:
            if process.returncode == 77 and mdwe:
                pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3+)")
            assert process.returncode is None, log.read_text()
            assert (state_directory / "salvor.db").exists()
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=WAIT
            ) as client:
                agent = (
                    await client.post(
                        "/v1/agents",
                        content=(REPO / "contrib/agents/refund-desk.toml").read_bytes(),
                        headers={"Content-Type": "application/toml"},
                    )
                ).json()["agent"]
                started = await client.post(
                    "/v1/runs", json={"agent": agent, "input": {"invoice_id": "INV-9"}}
                )
                run_id = started.json()["run"]
                with trio.fail_after(WAIT):
                    while (await client.get(f"/v1/runs/{run_id}")).json()["status"][
                        "state"
                    ] != "completed":
                        await trio.sleep(0.02)
            with trio.fail_after(WAIT):
                await notify.wait_for("WATCHDOG=1")
            process.send_signal(signal.SIGTERM)
            await notify.wait_for("STOPPING=1")
            with trio.fail_after(seconds(service["TimeoutStopSec"][-1])):
                assert await process.wait() == 0, log.read_text()
    finally:
        notify.close()


# -- nginx -----------------------------------------------------------------------------------------


def nginx_config(tmp_path: Path, *, listen_port: int, daemon_port: int) -> Path:
    """A minimal nginx.conf around the site, its ports moved to the test's."""
    nginx = shutil.which("nginx") or (
        Path("/usr/sbin/nginx") if Path("/usr/sbin/nginx").exists() else None
    )
    if nginx is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light)")
    site = SITE.read_text()
    site = re.sub(r"^\s*listen \[::\]:80;\n", "", site, flags=re.MULTILINE)
    site = site.replace("listen 80;", f"listen 127.0.0.1:{listen_port};")
    site = site.replace("server 127.0.0.1:8420;", f"server 127.0.0.1:{daemon_port};")
    (tmp_path / "site.conf").write_text(site)
    temp = tmp_path / "nginx-temp"
    temp.mkdir()
    temp_paths = "".join(
        f"  {kind}_temp_path {temp / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # Run as root, nginx's workers would switch to `nobody`, who cannot enter pytest's tmp_path.
    user = "user root root;\n" if os.geteuid() == 0 else ""
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"{user}pid {tmp_path / 'nginx.pid'};\nerror_log {tmp_path / 'nginx-error.log'};\n"
        f"events {{}}\nhttp {{\n  access_log off;\n{temp_paths}  include "
        f"{tmp_path / 'site.conf'};\n}}\n"
    )
    return conf


def nginx_command(conf: Path, *extra: str) -> list[str]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    return [
        nginx,
        "-c",
        str(conf),
        "-p",
        str(conf.parent),
        "-e",
        str(conf.parent / "nginx-error.log"),
        *extra,
    ]


def test_nginx_accepts_the_site(tmp_path: Path) -> None:
    conf = nginx_config(tmp_path, listen_port=free_port(), daemon_port=8420)
    result = subprocess.run(
        nginx_command(conf, "-t"), check=False, capture_output=True, text=True, timeout=WAIT
    )
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


# -- the curl walkthrough --------------------------------------------------------------------------


# A marker, not pytest.skip in the body: a skip raised inside a trio test loses its reason.
@pytest.mark.skipif(
    shutil.which("curl") is None or shutil.which("bash") is None,
    reason="the walkthrough needs curl and bash (Debian: apt-get install curl bash)",
)
@pytest.mark.parametrize(
    "via",
    [
        "direct",
        pytest.param(
            "nginx",
            marks=pytest.mark.skipif(
                shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
                reason="nginx is not installed (Debian: apt-get install nginx-light)",
            ),
        ),
    ],
)
async def test_walkthrough(via: str, tmp_path: Path) -> None:
    salvor = salvor_executable()
    store = tmp_path / "salvor.db"
    daemon_port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "NOTIFY_SOCKET"}
    env["SALVOR_TEST_TOKEN"] = TOKEN
    notify = NotifySocket()
    serve = [
        salvor,
        "serve",
        "--listen",
        f"127.0.0.1:{daemon_port}",
        "--store",
        str(store),
        "--demo-tools",
        "--wake-interval",
        "0",
        "--auth-token",
        "SALVOR_TEST_TOKEN",
    ]
    try:
        async with running(
            serve, {**env, "NOTIFY_SOCKET": notify.path}, tmp_path / "daemon.log", notify
        ) as daemon:
            assert daemon.returncode is None, (tmp_path / "daemon.log").read_text()
            url = f"http://127.0.0.1:{daemon_port}"
            if via == "nginx":
                proxy_port = free_port()
                conf = nginx_config(tmp_path, listen_port=proxy_port, daemon_port=daemon_port)
                nginx = nginx_command(conf, "-g", "daemon off;")
                proxy = await trio.lowlevel.open_process(
                    nginx, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                url = f"http://127.0.0.1:{proxy_port}"
            try:
                if via == "nginx":
                    await wait_listening(proxy_port, proxy)
                result = await trio.run_process(
                    ["bash", str(WALKTHROUGH)],
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    env={
                        **env,
                        "SALVOR_URL": url,
                        "SALVOR_TOKEN": TOKEN,
                        "SALVOR_BIN": salvor,
                        "SALVOR_STORE": str(store),
                    },
                )
            finally:
                if via == "nginx" and proxy.returncode is None:
                    proxy.terminate()
                    with trio.move_on_after(WAIT):
                        await proxy.wait()
    finally:
        notify.close()
    output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    assert result.returncode == 0, output
    assert "done:" in output
    # Each part's run was watched to its end over the stream: part 3 has two, one settled by
    # its probe, one its probe could not tell (no ledger in this daemon), resolved by hand; part
    # 4 a graph run and its fork, refused first for its write, then acknowledged; part 5 a
    # question answered (a wrong answer refused first) and a parent whose one child finished.
    assert output.count('end: {"state": "completed"') == 8, output
    assert output.count('end: {"state": "suspended"') == 3, output
    assert "$.answer must be one of" in output and '"parent": ' in output, output
    assert '"outputs": {"verdict": "demo", "confidence": 1}' in output, output
    assert '"code": "approval_schema_violation"' in output, output
    assert '"code": "write_replay_hazard"' in output and '"derived": true' in output, output
    assert output.count("settled by probe") == 1 and "settled by operator" in output, output
    assert output.count('end: {"state": "needs_reconciliation"') == 1, output


async def wait_listening(port: int, process: trio.Process) -> None:
    with trio.fail_after(WAIT):
        while True:
            assert process.returncode is None, "nginx exited; see nginx-error.log"
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.02)
                continue
            await stream.aclose()
            return
