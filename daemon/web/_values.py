"""Checks on URLs and header values that definitions carry, shared by every kind of agent.

A header value may name daemon variables as ``${NAME}``; the definition keeps
the placeholder and the daemon resolves it each time it connects, so a
secret is never stored.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def header_placeholders(value: str) -> list[str]:
    """The variables a header value names as ``${NAME}``, in order of appearance."""
    return PLACEHOLDER.findall(value)


def stray_placeholder(value: str) -> bool:
    """Whether a ``${`` in ``value`` opens no well-formed ``${NAME}`` (a typo
    that would go out verbatim)."""
    return "${" in PLACEHOLDER.sub("", value)


def is_http_url(url: str) -> bool:
    """An http:// or https:// URL with a host, a valid port when it has one, and no whitespace."""
    try:
        parts = urlsplit(url)
        port_ok = (
            parts.port is None or parts.port > 0
        )  # reading .port refuses a non-numeric or out-of-range one
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and port_ok
        and not any(c.isspace() for c in url)
    )
