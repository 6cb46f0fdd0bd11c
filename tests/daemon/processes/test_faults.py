"""The kill tests' commit hook is decided once, when the store's writer is set up.

It is absent when off.
"""

from __future__ import annotations

import pytest
from salvor.daemon.processes import _faults, kill_after_commit_hook
from salvor.daemon.recording._store_access import open_store_access


def test_no_hook_without_the_variable() -> None:
    assert kill_after_commit_hook({}) is None


def test_the_hook_kills_only_for_the_batch_that_holds_the_seq(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deaths: list[str] = []
    monkeypatch.setattr(_faults, "_die", lambda: deaths.append("killed"))
    hook = kill_after_commit_hook({"SALVOR_FAULT_KILL_AFTER_SEQ": "3"})
    assert hook is not None
    hook(1, 2)
    hook(4, 9)
    assert deaths == []
    hook(2, 3)
    assert deaths == ["killed"]


def test_a_seq_that_is_no_number_is_refused_when_the_hook_is_asked_for() -> None:
    with pytest.raises(
        ValueError, match="SALVOR_FAULT_KILL_AFTER_SEQ must be a whole number, not 'x'"
    ):
        kill_after_commit_hook({"SALVOR_FAULT_KILL_AFTER_SEQ": "x"})


async def test_the_store_access_installs_the_hook_only_when_asked(
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SALVOR_FAULT_KILL_AFTER_SEQ", raising=False)
    async with open_store_access(store_url) as access:
        assert access.post_commit is None
    monkeypatch.setenv("SALVOR_FAULT_KILL_AFTER_SEQ", "7")
    async with open_store_access(store_url) as access:
        assert access.post_commit is not None
