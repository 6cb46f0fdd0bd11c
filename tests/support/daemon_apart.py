"""A daemon that cannot see the project beside it, as a daemon on another machine cannot: the
link's tests start one whose working directory is an empty directory of its own."""

from __future__ import annotations

from pathlib import Path

from tests.chaos.test_kill_serve import Daemon
from tests.support.scripted_provider import ScriptedProvider


def daemon_apart(
    tmp_path: Path, store_url: str, provider: ScriptedProvider | None = None
) -> Daemon:
    """A daemon (not started) in ``tmp_path/daemon-home``, its effects ledger beside it, its model
    endpoint ``provider``'s when one is given."""
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.cwd = tmp_path / "daemon-home"
    daemon.cwd.mkdir()
    if provider is not None:
        daemon.args += ["--model-endpoint", provider.base_url]
    return daemon
