"""``docs/openapi.json``, the API reference the repository keeps, is exactly the document a daemon
started as the README starts it serves: a real ``salvor serve --demo-tools`` process, its
``GET /v1/openapi.json`` compared whole, and the file's text written as the regenerate command
writes it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from salvor.daemon.api._reference import REGENERATE, reference_document, reference_text

from tests.chaos.test_kill_serve import Daemon

REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"


def test_the_committed_reference_is_what_a_readme_daemon_serves(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, f"sqlite:///{tmp_path / 'salvor.db'}", tmp_path / "effects.jsonl")
    daemon.start()
    try:
        answered = httpx.get(f"{daemon.base_url}/v1/openapi.json", timeout=30)
    finally:
        code, _ = daemon.terminate()
    assert code == 0, daemon.log()
    assert answered.status_code == 200, answered.text
    served = answered.json()
    committed = REFERENCE.read_text(encoding="utf-8")
    stale = f"docs/openapi.json is not what the daemon serves; regenerate it: {REGENERATE}"
    assert json.loads(committed) == served, stale
    assert reference_document() == served, "the regenerate command builds another document"
    assert committed == reference_text(served), (
        f"docs/openapi.json is not written as the regenerate command writes it: {REGENERATE}"
    )
