"""The web pages ``salvor serve`` answers at ``/`` (the dashboard) and ``/docs`` (the API
reference): their files and how to read one.

Rule: plain files shipped in the package (HTML, ES modules, CSS), nothing built
or fetched at install or at run time. The page talks to the daemon through the
public API and the WebSocket only; it holds no data of its own. Imports no other room.
"""

from __future__ import annotations

from ._assets import (
    CONTENT_TYPES,
    INDEX,
    REFERENCE,
    Asset,
    read_asset,
)

__all__ = [
    "CONTENT_TYPES",
    "INDEX",
    "REFERENCE",
    "Asset",
    "read_asset",
]
