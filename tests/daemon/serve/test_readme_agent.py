"""The README's "three commands" for an SDK agent, run as written.

A real `salvor serve --allow-process-agents` on the Unix socket the README's first command names
(with the scripted provider as the upstream instead of api.openai.com), then the README's own
shell lines, its `curl` speaking that socket: register `contrib/agents/openai-sdk`, start a run,
follow its stream to the end. Then its re-run lines: over the API and with `salvor rerun`, both
with zero upstream calls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.chaos.test_kill_serve import Daemon
from tests.support.backends import SQLITE_ONLY
from tests.support.readme import pick_helper, sh_blocks
from tests.support.readme import shell as readme_shell
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script

REPO = Path(__file__).resolve().parents[3]
# SQLite alone (tests/support/backends.py): the README's lines run as written, over the SQLite
# store its commands create.
STORE_BACKENDS = SQLITE_ONLY
SECTION = "## Your own agent, durable in three commands"


def readme_blocks() -> tuple[str, list[str], list[str]]:
    """The `pick` helper, then the section's two sh blocks as lists of lines."""
    blocks = [block.splitlines() for block in sh_blocks(SECTION)]
    return pick_helper(), blocks[0], blocks[1]


def shell(lines: list[str], env: dict) -> subprocess.CompletedProcess:
    return readme_shell(lines, env, timeout=120)


def test_the_readme_makes_an_sdk_agent_durable_in_three_commands(
    tmp_path: Path, store_url: str
) -> None:
    pick, commands, rerun = readme_blocks()
    assert len(commands) == 4 and commands[0].endswith(
        "salvor serve --allow-process-agents --listen unix:$XDG_RUNTIME_DIR/salvor.sock"
    )
    runtime_dir = tmp_path / "run"
    runtime_dir.mkdir(mode=0o700)
    provider = ScriptedProvider(
        tool_loop_script(
            [("lookup_invoice", {"invoice_id": "INV-1001"})], final_text="INV-1001 was paid twice."
        )
    )
    # The README's command as printed: the default workers.
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl", one_process=False)
    daemon.env.update(SALVOR_AGENT_UPSTREAM=f"{provider.base_url}/v1", SALVOR_AGENT_KEY="sk-readme")
    daemon.listen_on(runtime_dir / "salvor.sock")
    daemon.allow_process_agents()
    daemon.cwd = REPO
    # The README's reader has .venv/bin on PATH, so the agent's
    # `python3` is the one with openai in it.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    daemon.env.update(PATH=path)
    try:
        daemon.start()
        env = {
            **os.environ,
            "PATH": path,
            "XDG_RUNTIME_DIR": str(runtime_dir),
            "SALVOR_STORE": store_url,
        }
        env = {
            k: v for k, v in env.items() if k not in ("SALVOR_AGENT_UPSTREAM", "SALVOR_AGENT_KEY")
        }
        result = shell([pick, *commands[1:], 'echo "RUN=$RUN"'], env)
        assert result.returncode == 0, result.stderr
        run_id = result.stdout.rsplit("RUN=", 1)[1].strip()
        assert "event: end" in result.stdout and '"completed"' in result.stdout, result.stdout
        with daemon.client(timeout=30) as client:
            body = client.get(f"/v1/runs/{run_id}").json()
            assert body["status"] == {
                "state": "completed",
                "output": {"reply": "INV-1001 was paid twice.", "exit_code": 0},
            }, body
            served = provider.call_count
            assert served == 2
            # The re-run lines: the API one answers at once, the CLI one drives to the end.
            # The same shell as the reader's: its `curl` speaks the socket.
            result = shell([pick, commands[1], f"RUN={run_id}", *rerun], env)
            assert result.returncode == 0, result.stdout + result.stderr
            assert (
                f'"replay_of": "{run_id}"' in result.stdout
                or f'"replay_of":"{run_id}"' in result.stdout
            )
            assert (
                'completed: {"reply": "INV-1001 was paid twice.", "exit_code": 0}' in result.stdout
            )
            reruns = [r for r in client.get("/v1/runs").json()["runs"] if r["run"] != run_id]
            assert len(reruns) == 2
            deadline = time.monotonic() + 60
            while client.get(f"/v1/runs/{reruns[0]['run']}").json()["status"]["state"] == "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            for rerun_summary in reruns:
                body = client.get(f"/v1/runs/{rerun_summary['run']}").json()
                assert body["status"]["state"] == "completed" and body["replay_of"] == run_id, body
        assert provider.call_count == served
    finally:
        if daemon.alive():
            daemon.kill()
        provider.stop()
