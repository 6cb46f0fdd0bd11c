"""Checks on URLs and header values that definitions carry, shared by every kind of agent.

A header value may name daemon variables as ``${NAME}``; the definition keeps
the placeholder and the daemon resolves it each time it connects, so a
secret is never stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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


class UnfillableHeader(ValueError):
    """A header names a variable that cannot go into it; the message names the header and the
    variable, never a value."""

    def __init__(self, header: str, name: str, why: str) -> None:
        super().__init__(f"header {header} names ${{{name}}}, which {why}")


def fill_headers(headers: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with each ``${NAME}`` replaced by the daemon's variable, read now.

    Which variables a definition may name at all is the operator's to say
    (``agents.Credentials.check_reach``); this only fills them in.

    Raises:
        UnfillableHeader: a named variable is not set, or holds a line break or
            NUL (it would end the header; refused here because an HTTP client's own
            refusal quotes the value); nothing is sent.
    """
    filled = {}
    for header, value in headers.items():
        for name in header_placeholders(value):
            if name not in environ:
                raise UnfillableHeader(header, name, "the daemon's environment does not set")
            if any(c in environ[name] for c in "\r\n\0"):
                raise UnfillableHeader(header, name, "holds a line break or NUL")
            value = value.replace("${" + name + "}", environ[name])
        filled[header] = value
    return filled


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
