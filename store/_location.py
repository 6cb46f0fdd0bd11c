"""Where a store lives: the default location and the accepted spellings of a store URL."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ._errors import StoreUnavailable


def default_store_url(environ: Mapping[str, str] = os.environ) -> str:
    """The store URL salvor uses when none is given.

    ``SALVOR_STORE`` when set; else ``salvor.db`` in the state directory systemd
    hands the service (``STATE_DIRECTORY``, its first entry when it lists
    several); else ``$XDG_STATE_HOME/salvor/salvor.db``; else
    ``~/.local/state/salvor/salvor.db``. The directory is created by
    ``EventStore.open``, not here.

    Returns:
        A SQLAlchemy URL, ``sqlite:///`` followed by an absolute path, or the
        normalised form of ``SALVOR_STORE``.
    """
    explicit = environ.get("SALVOR_STORE")
    if explicit:
        return normalize_store_url(explicit)
    state_directory = environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state_directory:
        return _sqlite_url(Path(state_directory) / "salvor.db")
    xdg = environ.get("XDG_STATE_HOME")
    if xdg and Path(xdg).is_absolute():
        base = Path(xdg)
    else:
        # The XDG spec says a relative XDG_STATE_HOME is invalid and must be ignored.
        home = environ.get("HOME") or str(Path.home())
        base = Path(home) / ".local" / "state"
    return _sqlite_url(base / "salvor" / "salvor.db")


def normalize_store_url(text: str) -> str:
    """Turn what a person typed into a store URL SQLAlchemy opens with the right driver.

    A plain filesystem path becomes ``sqlite:///<absolute path>``; a
    ``sqlite:///`` URL is kept; ``postgres://`` and ``postgresql://`` get the
    psycopg 3 driver (``postgresql+psycopg://``).

    Raises:
        StoreUnavailable: the text is empty or names a database salvor does not support.
    """
    text = text.strip()
    if not text:
        raise StoreUnavailable("the store URL is empty; give a file path or a postgresql:// URL")
    if "://" not in text:
        return _sqlite_url(Path(text))
    scheme, rest = text.split("://", 1)
    scheme = scheme.lower()
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+psycopg://{rest}"
    if scheme.startswith("postgresql+") or scheme == "sqlite":
        return f"{scheme}://{rest}"
    raise StoreUnavailable(
        f"the store URL scheme {scheme!r} is not supported; use a file path, "
        "sqlite:///PATH or postgresql://HOST/DB"
    )


def _sqlite_url(path: Path) -> str:
    return f"sqlite:///{Path(os.path.abspath(path.expanduser()))}"


def sqlite_path(url: str) -> Path | None:
    """The database file a normalised ``sqlite:///`` URL names; None for any other store."""
    if not url.startswith("sqlite:///"):
        return None
    return Path(url.removeprefix("sqlite:///").split("?", 1)[0])
