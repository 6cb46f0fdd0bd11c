"""The operator's settings: integer rows of ``store_meta`` beside the schema version
(``store.settings``).
"""

from __future__ import annotations

from sqlalchemy import bindparam, select

from ._repository import Repository
from ._schema import VERSION_KEY, store_meta

_SELECT_SETTING = select(store_meta.c.value).where(store_meta.c.key == bindparam("key"))


class Settings(Repository):
    """The settings rows of ``store_meta`` (never its schema-version row)."""

    def get_setting(self, key: str) -> int | None:
        """The operator setting ``key`` as ``put_setting`` last wrote it, or None when never set.

        Raises:
            ValueError: ``key`` is the schema version's row, which is no setting.
            StoreUnavailable: the database failed.
        """
        _setting_key(key)
        with self._reading("read a setting") as connection:
            return connection.execute(_SELECT_SETTING, {"key": key}).scalar_one_or_none()

    def put_setting(self, key: str, value: int) -> None:
        """Set the operator setting ``key`` to ``value`` (a row of ``store_meta``), replacing it.

        A failure leaves the earlier value, if any, as it was.

        Raises:
            ValueError: ``key`` is the schema version's row (or empty), or ``value`` is not an
                int; nothing was written.
            StoreUnavailable: the database failed; nothing was written.
        """
        _setting_key(key)
        if type(value) is not int:
            raise ValueError(f"a setting's value is an int, not {type(value).__name__}")
        self._upsert(
            store_meta, {"key": key, "value": value}, ("key",), f"write the setting {key!r}"
        )


def _setting_key(key: str) -> None:
    # The version row shares the table; a setting written over it would mis-describe the schema.
    if not isinstance(key, str) or not key or key == VERSION_KEY:
        raise ValueError(f"{key!r} is not a setting's key")
