"""Uploads in the store: taken once (deleted as they are returned), swept by age on the store's
clock, and a version-9 store gains their table."""

from __future__ import annotations

from salvor.store import STORE_VERSION, EventStore

from tests.store.test_store import execute_sql


def test_an_upload_is_taken_once_and_deleted_as_it_is(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        store.uploads.put("upl_a", "aa" * 32, b"\x1f\x8barchive-a")
        store.uploads.put("upl_b", "bb" * 32, b"archive-b")
        taken = store.uploads.take(["upl_a", "upl_missing"], budget=1 << 20)
        assert taken is not None and set(taken) == {"upl_a"}
        assert taken["upl_a"].content_hash == "aa" * 32
        assert taken["upl_a"].archive == b"\x1f\x8barchive-a"
        assert not store.uploads.held("upl_a") and store.uploads.held("upl_b")
        assert store.uploads.take(["upl_a"], budget=1 << 20) == {}


def test_uploads_past_the_budget_are_deleted_unread(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        store.uploads.put("upl_a", "aa" * 32, b"x" * 600)
        store.uploads.put("upl_b", "bb" * 32, b"y" * 600)
        assert store.uploads.take(["upl_a", "upl_b"], budget=1000) is None
        assert not store.uploads.held("upl_a") and not store.uploads.held("upl_b")


def test_the_sweep_deletes_uploads_older_than_its_age(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        store.uploads.put("upl_old", "aa" * 32, b"old")
        store.uploads.put("upl_new", "bb" * 32, b"new")
        assert store.uploads.sweep() == 0  # an hour: both are fresh
        execute_sql(
            store_url,
            "UPDATE uploads SET created_at = '2000-01-01T00:00:00.000000Z' "
            "WHERE upload_id = 'upl_old'",
        )
        assert store.uploads.sweep() == 1
        assert not store.uploads.held("upl_old") and store.uploads.held("upl_new")
        assert store.uploads.sweep(older_than=0) == 1
        assert not store.uploads.held("upl_new")


def test_a_version_9_store_gains_the_uploads_table(store_url: str) -> None:
    EventStore.open(store_url).close()
    execute_sql(store_url, "DROP TABLE uploads")
    execute_sql(store_url, "UPDATE store_meta SET value = 9")
    with EventStore.open(store_url) as store:
        store.uploads.put("upl_kept", "aa" * 32, b"kept")
        assert store.uploads.held("upl_kept")
    assert STORE_VERSION >= 10
