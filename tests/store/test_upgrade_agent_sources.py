"""A version-10 store opened by this build: its agents gain ``source_path`` (none, so the catalog
lists each as registered in the store), and a later registration from a file records it."""

from __future__ import annotations

from salvor.store import STORE_VERSION, EventStore, normalize_store_url
from sqlalchemy import create_engine, text

from tests.store.test_store import execute_sql

HASH = "sha256:" + "b" * 64


def test_a_version_10_stores_agents_gain_a_source_path_a_file_registration_sets(
    store_url: str,
) -> None:
    with EventStore.open(store_url) as store:
        store.definitions.put_agent(HASH, format="toml", definition='model = "m"\n', name="old")
    for statement in (
        "ALTER TABLE agents DROP COLUMN source_path",
        "UPDATE store_meta SET value = 10",
    ):
        execute_sql(store_url, statement)
    with EventStore.open(store_url) as store:
        (agent,) = store.definitions.list_agents()
        assert (agent.name, agent.source_path) == ("old", None)
        # Registered again over the API: still none; then from a file: that file, kept.
        assert store.definitions.put_agent(HASH, format="toml", definition="x", name=None) is False
        assert store.definitions.get_agent(HASH).source_path is None
        store.definitions.put_agent(
            HASH, format="toml", definition='model = "m"\n', name="old", source_path="/p/a.toml"
        )
        store.definitions.put_agent(HASH, format="toml", definition="x", name=None)
        assert store.definitions.get_agent(HASH).source_path == "/p/a.toml"
    engine = create_engine(normalize_store_url(store_url))
    with engine.connect() as connection:
        version = connection.execute(text("SELECT value FROM store_meta")).scalar_one()
    engine.dispose()
    assert version == STORE_VERSION
