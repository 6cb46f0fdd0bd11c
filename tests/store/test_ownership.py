"""The store lock a daemon takes (``open_locks``): released the moment its holder closes it."""

from __future__ import annotations

from salvor.store import EventStore, normalize_store_url, open_locks


def test_a_closed_serve_lock_is_free_at_once_to_the_next_taker(store_url: str) -> None:
    # A daemon stopped and started again in one process (or a `salvor resume` right after a
    # `salvor serve` exits): the next claim must not find the lock of the one just closed. On
    # PostgreSQL a session lock left to the connection's end is released only when the
    # server has noticed the connection closed, a moment later; and a holder with this very
    # pid is no dead process to wait out.
    url = normalize_store_url(store_url)
    EventStore.open(url).close()
    for _ in range(20):
        first = open_locks(url, "serve")
        first.claim("serve", "")
        first.close()
        second = open_locks(url, "serve")
        try:
            second.claim("serve", "")
        finally:
            second.close()
