"""The demo tools act on a real ledger file: what each execution leaves in the world."""

from __future__ import annotations

import json
from pathlib import Path

from salvor.daemon.tools import demo_registry, dispatch
from salvor.protocol import Effect


async def test_publishing_is_a_write_with_no_key_so_every_execution_is_a_new_post(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "effects.jsonl"
    tool = demo_registry(str(ledger)).get("publish_post")
    assert tool.effect is Effect.WRITE and not tool.claims
    post = {"title": "Tides", "body": "A draft about tides."}
    first, _ = await dispatch(tool, post, run_id="r", seq=4, key=None)
    again, _ = await dispatch(tool, post, run_id="r", seq=4, key=None)
    other, _ = await dispatch(tool, post, run_id="fork", seq=4, key=None)
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [r["tool"] for r in records] == ["publish_post"] * 3
    # Published three times: nothing collapses a repeat (that is what a fork must be told).
    assert first == again == {"post_id": records[0]["post_id"], "title": "Tides"}
    assert other["post_id"] != first["post_id"]
