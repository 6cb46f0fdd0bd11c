"""Cancellation in the daemon states its reason, and the waits a stop depends on have a bound.

* Every ``cancel()`` in ``daemon/`` names why (read from the source: a new
  bare ``cancel()`` fails here, whoever adds it).
* An append whose writer thread died fails at once with a store fault
  instead of waiting forever; so does every append after it.
* A stop abandons an append the writer never confirms once the drain
  deadline has passed, and names the run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import salvor.daemon
import trio
from salvor.daemon._agent_def import parse_definition
from salvor.store import StoreUnavailable, store_fault

DAEMON = Path(salvor.daemon.__file__).resolve().parent


def _bare_cancels(path: Path) -> list[str]:
    """``x.cancel()`` calls in ``path`` that give trio no reason (no argument at all)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cancel"
                and not node.args and not node.keywords):
            found.append(f"{path.relative_to(DAEMON.parent)}:{node.lineno}")
    return found


def test_every_cancel_in_the_daemon_states_its_reason() -> None:
    bare = [site for path in sorted(DAEMON.rglob("*.py")) for site in _bare_cancels(path)]
    assert bare == [], "cancel() without a reason: " + ", ".join(bare)


AGENT = 'model = "scripted-model"\nsystem_prompt = "You settle refunds."\n[llm]\nbase_url = "http://127.0.0.1:9"\n'


class WriterKilled(BaseException):
    """What kills the writer thread here: nothing the write loop's ``except Exception`` catches."""


async def test_an_append_whose_writer_thread_died_fails_at_once_and_so_does_every_later_one(runtime) -> None:
    agent = parse_definition(AGENT, "toml")
    survivor = await runtime.start_run(agent, "before")

    def killed(requests):
        raise WriterKilled()

    runtime.access.store.append_batch = killed
    # A real bound, not virtual time: the writer is a thread, which autojump_clock does not wait for.
    with trio.fail_after(10):
        with pytest.raises(StoreUnavailable) as first:
            await runtime.start_run(agent, "during")
        with pytest.raises(StoreUnavailable) as later:
            await runtime.start_run(agent, "after")
        with pytest.raises(StoreUnavailable):
            await runtime.access.check_writable()
    assert "writer thread died (WriterKilled)" in first.value.message
    assert "whether it was committed is not known" in first.value.message
    assert not store_fault(first.value)  # a dead writer does not heal: healing would retry in vain
    assert "writer thread died (WriterKilled)" in later.value.message
    assert "nothing of this append was written" in later.value.message
    assert [e.seq for e in runtime.access.store.read_log(survivor)] == [0]
