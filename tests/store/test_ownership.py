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


def test_serving_names_the_daemon_holding_the_store_and_takes_nothing(store_url: str) -> None:
    # What a command line that holds no store lock asks, to say what works beside a daemon.
    url = normalize_store_url(store_url)
    EventStore.open(url).close()
    asking = open_locks(url, "run")
    try:
        assert asking.serving() is None
        daemon = open_locks(url, "serve")
        try:
            daemon.claim("serve", "")
            daemon.announce("http://127.0.0.1:8420")
            serving = asking.serving()
            assert serving is not None and serving.command == "serve"
            assert serving.listen == "http://127.0.0.1:8420"
        finally:
            daemon.close()
        assert asking.serving() is None
        # Asking took no lock: a daemon can claim the store while the asker is still open.
        again = open_locks(url, "serve")
        try:
            again.claim("serve", "")
        finally:
            again.close()
    finally:
        asking.close()
