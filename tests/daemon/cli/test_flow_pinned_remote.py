"""A pinned agent node over a link: ``salvor graph run FILE --remote URL`` against a real
`salvor serve` whose working directory is an empty directory of its own. Updating, the node's
calls come back in the result and are written here; comparing, the daemon answers them from the
baseline sent with the call and asks the scripted provider nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.chaos.test_kill_serve import Daemon
from tests.daemon.cli.test_flow_pinned import baseline_of, echo, project_with
from tests.support.cli import salvor_in_process
from tests.support.daemon_apart import daemon_apart
from tests.support.scripted_provider import ScriptedProvider


def run_remote(project: Path, daemon: Daemon, *flags: str) -> subprocess.CompletedProcess[str]:
    """``salvor graph run main.yaml --remote`` the daemon, with ``"hello"`` as the input."""
    return salvor_in_process(
        "graph",
        "run",
        str(project / ".salvor" / "flows" / "main.yaml"),
        "--remote",
        daemon.base_url,
        "--input",
        '"hello"',
        *flags,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def provider():
    with ScriptedProvider(echo) as serving:
        yield serving


def test_update_writes_the_calls_here_and_compare_asks_the_provider_nothing(
    tmp_path: Path, store_url: str, provider: ScriptedProvider
) -> None:
    project = project_with(tmp_path, provider.base_url)
    daemon = daemon_apart(tmp_path, store_url, provider)
    daemon.start()
    try:
        updated = run_remote(project, daemon, "--update-baselines")
        assert updated.returncode == 0, updated.stdout + updated.stderr
        assert len(provider.calls) == 1
        [call] = json.loads(baseline_of(project).read_text())["calls"]
        assert call["kind"] == "model" and call["response"]["content"][0]["text"] == "hello"
        assert list(daemon.cwd.iterdir()) == []

        compared = run_remote(project, daemon, "--json")
        assert compared.returncode == 0, compared.stdout + compared.stderr
        result = json.loads(compared.stdout)
        assert result["status"] == "completed" and result["baseline_writes"] == []
        assert result["output"] == {"answer": "hello"}
        assert len(provider.calls) == 1, "the compare asked the provider"

        (project / "agents" / "prompt.md").write_text("You echo the task, loudly.\n")
        changed = run_remote(project, daemon)
        assert changed.returncode == 3, changed.stdout + changed.stderr
        assert (
            "node 'answer': call 1 differs from its baseline "
            f"{os.path.realpath(baseline_of(project))}: the model request at $.system"
        ) in changed.stdout
        assert len(provider.calls) == 1
    finally:
        daemon.kill()
