"""No capability, token or key on any command line (issue 29, item 3).

``/proc/<pid>/cmdline`` is readable by every local user. A real daemon (with an auth token) runs
a real process agent, which spawns its MCP stand-in from ``SALVOR_MCP_SERVER_SALVOR`` as an MCP
client does (a scrubbed environment, the command line as given) and starts a session through
it. While both live, every ``/proc/*/cmdline`` on the machine is read, by root and by a second,
unprivileged user: neither finds the run's capability or the daemon's token anywhere. The
stand-in read its endpoint from a relay file only the daemon's user may open, removed when the
drive ends.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio

from tests.daemon.processes.test_agent_containment import _unprivileged
from tests.support.backends import SQLITE_ONLY

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
STORE_BACKENDS = SQLITE_ONLY  # what it tests is the processes, not the store

TOKEN = "tok-cmdline-4c19be0a77d2"

AGENT = r"""
import json, os, shlex, subprocess, sys, time
from pathlib import Path

out = Path(sys.argv[1])
argv = shlex.split(os.environ["SALVOR_MCP_SERVER_SALVOR"])
# What the mcp SDK gives the servers it spawns: these variables and nothing else.
kept = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
standin = subprocess.Popen(
    argv,
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    env={k: os.environ[k] for k in kept if k in os.environ},
)
hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "1"}}}
standin.stdin.write((json.dumps(hello) + "\n").encode())
standin.stdin.flush()
answer = json.loads(standin.stdout.readline())
relay = argv[-1]
(out / "ready.json").write_text(json.dumps({
    "answer": answer, "base": os.environ["OPENAI_BASE_URL"], "standin": standin.pid,
    "relay": relay, "modes": [os.stat(relay).st_mode & 0o777,
                              os.stat(os.path.dirname(relay)).st_mode & 0o777],
}))
deadline = time.monotonic() + 60
while not (out / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
standin.stdin.close()
standin.wait(10)
"""

# Reads its needles from stdin (an argument would put them on a command line itself).
SCAN = r"""
import json, os, sys
asked = json.loads(sys.stdin.read())
needles = asked["needles"]
found, read, opened = [], [], {}
for path in asked["files"]:
    try:
        open(path, "rb").close()
        opened[path] = "opened"
    except OSError as exc:
        opened[path] = type(exc).__name__
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read().decode("utf-8", "replace")
    except OSError:
        continue
    read.append(int(pid))
    found += [[int(pid), needle, line] for needle in needles if needle in line]
print(json.dumps({"found": found, "read": read, "opened": opened}))
"""


async def _scan(needles: list[str], files: list[str], as_user: list[str]) -> dict:
    done = await trio.run_process(
        [*as_user, "/usr/bin/python3" if as_user else sys.executable, "-I", "-S", "-c", SCAN],
        stdin=json.dumps({"needles": needles, "files": files}).encode(),
        capture_stdout=True,
        check=True,
    )
    return json.loads(done.stdout)


async def test_no_capability_or_token_is_on_any_command_line(server_factory, tmp_path):
    nobody = _unprivileged()
    if not Path("/usr/bin/python3").exists():
        pytest.skip("needs /usr/bin/python3 for the unprivileged user's scan")
    server = await server_factory(auth_token=TOKEN, allow_process_agents=True)
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    command = json.dumps([sys.executable, str(script), str(tmp_path)])
    agent = await server.register_agent(f'kind = "process"\ncommand = {command}\ntimeout = 90\n')
    run = await server.start_run(agent, "scan")
    ready = tmp_path / "ready.json"
    with trio.fail_after(60):
        while not ready.exists():
            await trio.sleep(0.05)
    seen = json.loads(ready.read_text())
    capability = seen["base"].split("/r/", 1)[1].split("/", 1)[0]
    try:
        needles = [capability, TOKEN]
        by_root = await _scan(needles, [], [])
        by_nobody = await _scan(needles, [seen["relay"]], nobody)
    finally:
        (tmp_path / "go").write_text("")
    body = await server.wait_resting(run, timeout=60)

    # The stand-in reached its endpoint (so it knew the URL) and both scans read its cmdline.
    assert "result" in seen["answer"], seen["answer"]
    assert len(capability) >= 16 and os.getuid() == 0
    assert seen["standin"] in by_root["read"] and seen["standin"] in by_nobody["read"]
    assert {"root": by_root["found"], "nobody": by_nobody["found"]} == {"root": [], "nobody": []}
    assert body["status"]["state"] in ("completed", "failed"), body
    # Where the endpoint was instead: the daemon user's alone, and gone with the drive.
    assert seen["modes"] == [0o600, 0o700]
    assert by_nobody["opened"] == {seen["relay"]: "PermissionError"}
    assert not Path(seen["relay"]).exists()
