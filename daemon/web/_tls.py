"""The one verifying TLS context every outbound HTTPS client of the daemon shares."""

from __future__ import annotations

import ssl
from functools import cache

import httpx


@cache
def tls_context() -> ssl.SSLContext:
    """The verifying TLS context every gateway's client shares.

    Building one loads the CA bundle, about 20 ms of CPU on the trio thread;
    a gateway is built per drive, so a thousand runs starting or recovering at
    once would otherwise stall the daemon for twenty seconds.
    """
    return httpx.create_ssl_context()
