"""Requests through a TLS-terminating proxy the operator trusts (``salvor serve --trusted-proxy``).

Behind such a proxy every request reaches the daemon over plain HTTP from the proxy's address. The
proxy says what it saw in ``X-Forwarded-Proto`` (the scheme the client used) and
``X-Forwarded-For`` (the client's address, appended last); ``TrustedProxies`` takes both as the
request's own scheme and client, so the session cookie gets ``Secure`` when the browser spoke https,
and wrong tokens are counted per real client rather than all against the proxy.

Only from a peer the operator listed: anyone else may write those headers too, so from any other
peer they are ignored, as they are when no proxy is listed (the default). What the proxy appended
is the rightmost entry of each header; entries further left came from the client and are never
read. A value that is not ``http``/``https``, or not an IP address, leaves the scope as it was.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_network(text: str) -> Network:
    """An operator's ``--trusted-proxy``: an address or a network (``10.0.0.0/8``).

    Raises:
        ValueError: neither, in one sentence naming the value.
    """
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(
            f"--trusted-proxy {text[:60]!r} is not an IP address or network (such as 127.0.0.1 "
            "or 10.0.0.0/8)"
        ) from None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _last(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The rightmost entry of a comma-separated header (all its lines joined), None without one."""
    values = [value.decode("latin-1") for key, value in headers if key.lower() == name]
    if not values:
        return None
    return ",".join(values).rsplit(",", 1)[-1].strip()


class TrustedProxies:
    """ASGI wrapper: a request from one of ``proxies`` gets the scheme and client its proxy
    forwarded; every other request passes as it came."""

    def __init__(self, app: Any, proxies: Iterable[Network | str]) -> None:
        self._app = app
        self._proxies = tuple(
            proxy if not isinstance(proxy, str) else trusted_network(proxy) for proxy in proxies
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self._proxies and scope["type"] in ("http", "websocket") and self._trusts(scope):
            scope = self._forwarded(scope)
        await self._app(scope, receive, send)

    def _trusts(self, scope: dict) -> bool:
        client = scope.get("client")
        peer = _address(str(client[0])) if client else None
        return peer is not None and any(peer in network for network in self._proxies)

    def _forwarded(self, scope: dict) -> dict:
        headers = scope.get("headers") or []
        scope = dict(scope)
        proto = (_last(headers, b"x-forwarded-proto") or "").lower()
        if proto in ("http", "https"):
            secure = proto == "https"
            if scope["type"] == "websocket":
                scope["scheme"] = "wss" if secure else "ws"
            else:
                scope["scheme"] = proto
        client = _address(_last(headers, b"x-forwarded-for") or "")
        if client is not None:
            scope["client"] = (str(client), 0)
        return scope
