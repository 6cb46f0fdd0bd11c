"""Where a process agent's live model calls go: the upstream the operator configured.

The credential goes into the outbound request's header and nowhere else; ``Upstream`` never
shows it (its ``repr`` and ``redact`` hide it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from ..models import ANTHROPIC_VERSION
from ._wire import (
    ANTHROPIC_MESSAGES,
)

DEFAULT_UPSTREAM_TIMEOUT = 600.0
_PASSED_HEADERS = ("anthropic-version", "anthropic-beta", "openai-organization", "openai-project")


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where live calls go and the credential they carry (never shown)."""

    base_url: str
    api_key: str | None
    # Seconds to wait for the upstream's answer (between bytes, for a stream).
    read_timeout: float = DEFAULT_UPSTREAM_TIMEOUT

    def __repr__(self) -> str:
        return (
            f"Upstream(base_url={self.base_url!r}, "
            f"api_key={'<redacted>' if self.api_key else None})"
        )

    @property
    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(connect=30.0, read=self.read_timeout, write=60.0, pool=60.0)

    def headers(self, wire: str, incoming: Mapping[str, str]) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        for name in _PASSED_HEADERS:
            if name in incoming:
                headers[name] = incoming[name]
        key = self.api_key
        if wire == ANTHROPIC_MESSAGES:
            headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
            if key and key.lower().startswith("bearer "):
                headers["authorization"] = key
            elif key:
                headers["x-api-key"] = key
        elif key:
            headers["authorization"] = key if key.lower().startswith("bearer ") else f"Bearer {key}"
        return headers

    def redact(self, text: str) -> str:
        key = self.api_key
        if key:
            text = text.replace(key, "<redacted>")
            bare = key.split(" ", 1)[-1]
            if bare:
                text = text.replace(bare, "<redacted>")
        return text


def resolve_upstream(
    environ: Mapping[str, str] = os.environ, *, key: str | None = None
) -> Upstream | None:
    """The upstream from ``SALVOR_AGENT_UPSTREAM``, else ``SALVOR_MODEL_BASE_URL``,
    else an ``OPENAI_BASE_URL`` already set; None when none is.

    ``environ`` is the daemon's own (the operator's): an agent definition's
    ``env`` goes to its process and never picks where the daemon connects.

    ``key``: the upstream key the daemon read from a file at start
    (``SALVOR_AGENT_KEY_FILE``, systemd's ``agent-key`` credential); it wins
    over ``SALVOR_AGENT_KEY`` and the providers' variables. An upstream found
    only in ``OPENAI_BASE_URL`` is OpenAI's wire, so it is never sent
    ``ANTHROPIC_API_KEY``.

    ``SALVOR_AGENT_UPSTREAM_TIMEOUT`` (seconds, default 600) bounds the wait
    for an answer; a value that is not a positive number keeps the default.
    """
    base = environ.get("SALVOR_AGENT_UPSTREAM") or environ.get("SALVOR_MODEL_BASE_URL")
    providers_keys = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    if not base:
        base = environ.get("OPENAI_BASE_URL")
        providers_keys = ("OPENAI_API_KEY",)
    if not base:
        return None
    key = (
        key
        or environ.get("SALVOR_AGENT_KEY")
        or next((environ[name] for name in providers_keys if environ.get(name)), None)
    )
    try:
        timeout = float(environ.get("SALVOR_AGENT_UPSTREAM_TIMEOUT", DEFAULT_UPSTREAM_TIMEOUT))
    except ValueError:
        timeout = DEFAULT_UPSTREAM_TIMEOUT
    if not 0 < timeout < float("inf"):
        timeout = DEFAULT_UPSTREAM_TIMEOUT
    return Upstream(base_url=base, api_key=key, read_timeout=timeout)
