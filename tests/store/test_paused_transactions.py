"""A process stopped inside a transaction on PostgreSQL holds nobody up for long: the server ends
its session (``IDLE_IN_TRANSACTION_SECONDS``), its row locks go with it, and a peer's takeover
goes ahead.

The stopped process is real: a child that renews its node's lease through the store and stops
itself (SIGSTOP) right after the renewal's UPDATE, before its COMMIT, the instant a scheduler or a
frozen VM may pick. On SQLite a writer stopped inside its transaction holds the file's write lock
until it continues (``store/_write_turns.py``): nothing can end it from outside, so this is
PostgreSQL's alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from salvor.protocol import EMPTY_VIEW, RunStarted
from salvor.store import Claimed, EventStore, Fence
from salvor.store._engine import IDLE_IN_TRANSACTION_SECONDS

STORE_BACKENDS = ("postgres",)

# The node's lease: long enough for the child to renew it on a loaded machine, short enough to
# lapse (by the database's clock) before the server ends the stopped session.
LEASE = 3.0
# How long the claim may take past the server's limit (one claim, on a loaded machine).
SLACK = 10.0

# The child: opens the store, waits for "go", renews node n1's lease and stops itself between the
# renewal's UPDATE and its COMMIT; once continued, prints how the renewal ended.
CHILD = """
import os, signal, sys
from sqlalchemy import event
from salvor.store import EventStore

store = EventStore.open(sys.argv[1])

@event.listens_for(store._engine, "after_cursor_execute")
def stop_here(conn, cursor, statement, *args):
    if statement.startswith("UPDATE nodes SET lease_expires_at"):
        print("holding" if cursor.rowcount == 1 else "lapsed", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

print("ready", flush=True)
sys.stdin.readline()
try:
    print("renewed" if store.owners.renew("n1", 30.0) else "refused", flush=True)
except Exception as exc:
    print(f"failed: {exc}", flush=True)
"""


def register(store: EventStore, node_id: str, lease: float) -> None:
    store.owners.register(
        node_id, name=node_id, host="h", boot_id="b", pid=1, pid_start="7", lease_seconds=lease
    )


def wait_stopped(pid: int) -> None:
    """Until ``pid`` (a child of this process) is stopped by a signal (bounded)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, status = os.waitpid(pid, os.WUNTRACED | os.WNOHANG)
        if status and os.WIFSTOPPED(status):
            return
        time.sleep(0.02)
    raise AssertionError("the child never stopped inside its renewal")


def test_a_node_stopped_inside_its_renewal_does_not_hold_up_the_takeover_of_its_runs(
    store_url: str,
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, store_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    peer = EventStore.open(store_url)
    try:
        assert child.stdout.readline() == "ready\n"
        register(peer, "n2", 60.0)
        register(peer, "n1", LEASE)
        fence = peer.owners.claim("r", "n1").fence
        peer.append("r", [RunStarted(agent_def_hash="sha256:a", input={})], EMPTY_VIEW, fence=fence)
        child.stdin.write("go\n")
        child.stdin.flush()
        # The renewal ran while n1's lease held: its UPDATE holds n1's row, uncommitted.
        assert child.stdout.readline() == "holding\n"
        wait_stopped(child.pid)
        stopped = time.monotonic()
        while peer.owners.owner("r").node_live:  # a read: it waits for no lock
            time.sleep(0.05)
        # The takeover judges n1 dead, a write to n1's row: it waits for the stopped renewal
        # only until the server ends that session.
        claimed: list = []
        claim = threading.Thread(
            target=lambda: claimed.append(peer.owners.claim("r", "n2")), daemon=True
        )
        claim.start()
        claim.join(IDLE_IN_TRANSACTION_SECONDS + SLACK)
        assert claimed == [Claimed(Fence("n2", 2), None, taken_from="n1")], (
            f"no takeover {time.monotonic() - stopped:.1f}s after n1 stopped inside its renewal"
        )
        # Continued, the node learns its renewal was not written; its lease stays lapsed.
        child.send_signal(signal.SIGCONT)
        assert child.stdout.readline().startswith("failed: ")
        assert not peer.owners.renew("n1", 30.0)
        assert peer.owners.owner("r").node_id == "n2"
    finally:
        child.kill()
        child.wait()
        peer.close()
