"""The command line: ``salvor serve|run|resume|resolve|...``, rendering, ``salvor doctor``,
``salvor graph validate``.

Rule: the top; nothing imports it.
"""

from __future__ import annotations

from ._main import (
    main,
)

__all__ = [
    "main",
]
