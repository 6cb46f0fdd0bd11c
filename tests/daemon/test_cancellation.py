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

import salvor.daemon

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
