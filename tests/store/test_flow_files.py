"""The files of flow runs, content-addressed in the store; a version-8 store gains their table."""

from __future__ import annotations

import hashlib

import pytest
from salvor.store import STORE_VERSION, EventStore

from tests.store.test_store import execute_sql


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_flow_files_are_kept_once_under_the_digest_of_their_bytes(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        store.flow_files.put({_digest(b"one"): b"one", _digest(b"\x00two"): b"\x00two"})
        store.flow_files.put({_digest(b"one"): b"one"})  # again: kept as it was
        assert store.flow_files.get(_digest(b"\x00two")) == b"\x00two"
        assert store.flow_files.get(_digest(b"three")) is None
        with pytest.raises(ValueError, match="is not the digest"):
            store.flow_files.put({_digest(b"one"): b"other"})
        assert store.flow_files.get(_digest(b"one")) == b"one"


def test_a_version_8_store_gains_the_flow_files_table(store_url: str) -> None:
    EventStore.open(store_url).close()
    execute_sql(store_url, "DROP TABLE flow_files")
    execute_sql(store_url, "UPDATE store_meta SET value = 8")
    with EventStore.open(store_url) as store:
        store.flow_files.put({_digest(b"kept"): b"kept"})
        assert store.flow_files.get(_digest(b"kept")) == b"kept"
    assert STORE_VERSION >= 9
