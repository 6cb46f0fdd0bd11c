"""Model wire formats (Anthropic Messages, OpenAI chat) and the gateway that calls a provider, plus
the demo model.

Rule: imports only ``web`` from the daemon.
"""

from __future__ import annotations

from ._clients import ModelClients
from ._gateway import (
    DEFAULT_KEY_ENV,
    PUBLIC_BASE_URLS,
    Delta,
    ModelCallError,
    ModelEndpoint,
    ModelGateway,
    endpoint_url,
    resolve_endpoint,
)
from ._wire import (
    ANTHROPIC_VERSION,
)

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_KEY_ENV",
    "PUBLIC_BASE_URLS",
    "Delta",
    "ModelCallError",
    "ModelClients",
    "ModelEndpoint",
    "ModelGateway",
    "endpoint_url",
    "resolve_endpoint",
]
