"""Operator settings in the store (rows of ``store_meta`` beside the schema version), on both
backends: unset reads as None, a write replaces the value and survives reopening, and a bad
write changes nothing."""

from __future__ import annotations

import pytest
from salvor.store import STORE_VERSION, EventStore, normalize_store_url
from sqlalchemy import create_engine, text

KEY = "flows.edit_mode"


def _version(store_url: str) -> int:
    engine = create_engine(normalize_store_url(store_url))
    try:
        with engine.connect() as connection:
            return connection.execute(
                text("SELECT value FROM store_meta WHERE key = 'schema_version'")
            ).scalar_one()
    finally:
        engine.dispose()


def test_a_setting_never_written_reads_as_none(store: EventStore) -> None:
    assert store.settings.get_setting(KEY) is None


def test_a_setting_is_replaced_and_survives_reopening(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        store.settings.put_setting(KEY, 1)
        assert store.settings.get_setting(KEY) == 1
        store.settings.put_setting(KEY, 0)
        store.settings.put_setting("another.setting", 7)
        assert store.settings.get_setting(KEY) == 0
    with EventStore.open(store_url) as store:
        assert (store.settings.get_setting(KEY), store.settings.get_setting("another.setting")) == (
            0,
            7,
        )
    # Settings share the table with the schema version and leave it as it was.
    assert _version(store_url) == STORE_VERSION


@pytest.mark.parametrize(
    ("key", "value"),
    [("schema_version", 1), ("", 1), (KEY, True), (KEY, "1"), (KEY, 1.0)],
)
def test_a_bad_setting_is_refused_and_writes_nothing(
    store_url: str, key: str, value: object
) -> None:
    with EventStore.open(store_url) as store:
        store.settings.put_setting(KEY, 1)
        with pytest.raises(ValueError):
            store.settings.put_setting(key, value)  # type: ignore[arg-type]
        assert store.settings.get_setting(KEY) == 1
    assert _version(store_url) == STORE_VERSION


def test_the_schema_version_row_is_no_setting(store: EventStore) -> None:
    with pytest.raises(ValueError):
        store.settings.get_setting("schema_version")
