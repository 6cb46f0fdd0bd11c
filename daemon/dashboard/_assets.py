"""One file of the page, read from the package's ``static/`` folder by its plain name.

A name is a plain file name: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or
digit, with a suffix this module knows the content type of. Anything else (a ``/``, a ``..``, a
hidden file, an unknown suffix) is refused before the file system is asked, so no name reaches
outside the folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"
INDEX = "index.html"
# The API reference, drawn from the daemon's OpenAPI document (``GET /docs``).
REFERENCE = "docs.html"

# What the page is made of; a file of any other kind in the folder is not served.
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)+")


@dataclass(frozen=True, slots=True, kw_only=True)
class Asset:
    """A page file as served: its bytes and their content type."""

    name: str
    body: bytes
    content_type: str


def asset_path(name: str) -> Path | None:
    """Where the asset ``name`` lives, or None when ``name`` is not one the page may serve.

    Pure: checks the name alone and touches no file."""
    if not _PLAIN_NAME.fullmatch(name):
        return None
    path = STATIC / name
    if path.suffix not in CONTENT_TYPES:
        return None
    return path


def read_asset(name: str) -> Asset | None:
    """The asset ``name`` with its content type, or None when there is no such page file.

    Blocking (it reads a file): the daemon calls it in a thread. A name that is not a plain
    file name, has an unknown suffix, or names a folder or a link out of ``static/`` is None, as a
    missing file is; nothing is left behind either way."""
    path = asset_path(name)
    # A link could point anywhere; the page's files are plain files in the folder itself.
    if path is None or path.is_symlink() or not path.is_file():
        return None
    try:
        body = path.read_bytes()
    except OSError:
        return None
    return Asset(name=name, body=body, content_type=CONTENT_TYPES[path.suffix])
