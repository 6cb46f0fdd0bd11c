"""What a browser may ask of the daemon: the ``Host`` a request names, the ``Origin`` it comes
from, and the media type of a JSON body.

The daemon runs beside its operator's browser. A page on any site can make that browser send
simple requests to 127.0.0.1 (a form post, a ``no-cors`` fetch, a WebSocket handshake), and a page
whose DNS name is rebound to 127.0.0.1 reaches the daemon as if it were the daemon's own page. So,
on every listener of the daemon (the control plane and its page, the model proxy and the MCP
stand-ins of process agents, a service agent's port, an MCP server's fixed port), with a bearer
token or without:

* ``Host`` must name this daemon: ``localhost``, a loopback address (127.0.0.0/8, ``[::1]``), or a
  name the operator gave (``--allow-host``, and the ``--listen`` host), with any port. A rebound
  name is none of them. The port is not compared: only a forward the operator set up
  (``ssh -L 9000:127.0.0.1:8420``) makes it differ from the listener's, and a name, not a port,
  is what a rebinding page forges. ``app.localhost`` is no loopback name here: browsers resolve
  such names themselves, other clients may ask DNS; an operator who uses one adds it.
* A request that carries an ``Origin`` must come from the daemon's own origin (the one whose host
  and port are the request's ``Host``; http or https alike, for a proxy that ends TLS) or one the
  operator listed (``--allow-origin``). Browsers send an ``Origin`` with every request that
  changes state, every WebSocket handshake and every cross-origin fetch; the daemon's own page
  loading itself sends none, and neither do the agents' SDKs, curl or the CLI.
* A body read as JSON must say so: ``application/json`` or an ``application/<x>+json`` type,
  parameters (``charset``) allowed. None at all, ``text/plain`` or a form type is what a page of
  another site can send without the browser asking first, so none of them is JSON here. An empty
  body needs no type. Where every body of a listener is JSON (the agents' ports) the listener
  checks it for every POST, PUT and PATCH; the control plane checks it where it reads one
  (``json_media_type``), beside the routes that take TOML, YAML or markdown.

A refusal is the one error envelope, 403 ``forbidden`` (Host, Origin) or 415
``unsupported_media_type``, answered before anything reads the body or the store: it records
nothing. Pure: ``refusal`` decides from the request's method and headers alone; ``guarded`` puts
it in front of an ASGI app.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from salvor.protocol import ErrorCode, excerpt

from ._errors import OperationRefused
from ._wording import HTTP_WORDING

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
# A DNS name (RFC 1123 labels) or an IPv4 address; an IPv6 one is bracketed and read by ipaddress.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[0-9]{1,5}")
_LOOPBACK_NAMES = frozenset({"localhost"})
# What a listener bound to every interface is called: no name a request could send.
_WILDCARDS = frozenset({"", "0.0.0.0", "[::]"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def _host_name(text: str) -> str | None:
    """The name of a ``Host`` value (``name[:port]``, ``[v6][:port]``) in canonical form: lower
    case, an IPv6 address compressed and bracketed. None when it is not one."""
    text = text.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        if end == -1:
            return None
        try:
            name = f"[{ipaddress.IPv6Address(text[1:end]).compressed}]"
        except ValueError:
            return None
        rest = text[end + 1 :]
    else:
        name, colon, port = text.partition(":")
        rest = colon + port
        if not _NAME.fullmatch(name):
            return None
    if rest and not (rest.startswith(":") and _PORT.fullmatch(rest[1:])):
        return None
    return name


def _loopback(name: str) -> bool:
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def canonical_host(text: str) -> str:
    """A name the operator gave (``--allow-host``, the ``--listen`` host) in the form ``Host``
    values are compared in.

    Raises:
        ValueError: it is not a host name or address, or it carries a port; the message is one
            sentence naming the flag's form.
    """
    name = text.strip().lower()
    if ":" in name and not name.startswith("["):
        try:
            name = f"[{ipaddress.IPv6Address(name).compressed}]"
        except ValueError:
            pass
    found = _host_name(name)
    with_port = not name.endswith("]") if name.startswith("[") else ":" in name
    if found is None or with_port:
        raise ValueError(
            f"--allow-host takes a host name or address without a port (any port is accepted), "
            f"such as salvor.example.com or 192.0.2.7, not {text[:80]!r}"
        )
    return found


def canonical_origin(text: str) -> str:
    """An origin the operator listed (``--allow-origin``) as browsers serialize one:
    ``scheme://host[:port]``, lower case, no default port, no path.

    Raises:
        ValueError: it is not an http or https origin; the message is one sentence.
    """
    value = text.strip().lower().removesuffix("/")
    scheme, found, authority = value.partition("://")
    name = _host_name(authority) if found and scheme in _DEFAULT_PORTS else None
    if name is None or any(c in authority for c in "/?#@"):
        raise ValueError(
            f"--allow-origin takes an origin, scheme://host[:port] with http or https and no path "
            f"(as a browser sends it in Origin), such as https://ops.example.com, not {text[:80]!r}"
        )
    port = authority[len(name) :].removeprefix(":")
    if port == _DEFAULT_PORTS[scheme]:
        authority = name
    return f"{scheme}://{authority}"


def media_type(content_type: str | None) -> str:
    """A ``Content-Type`` value's media type: lower case, without parameters ("" for none)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_json_media(media: str) -> bool:
    """Whether a media type (as ``media_type`` gives it) says the body is JSON."""
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def unsupported_media_type(message: str) -> OperationRefused:
    return OperationRefused(ErrorCode.UNSUPPORTED_MEDIA_TYPE, message)


def json_media_type(media: str) -> None:
    """Refuse a body read as JSON whose media type (``media_type``'s form) does not say so.

    Raises:
        OperationRefused: unsupported_media_type (415); the body has not been used.
    """
    if not is_json_media(media):
        sent = f"as {excerpt(media)}" if media else "without a Content-Type"
        raise unsupported_media_type(
            f"a JSON body must be sent with `Content-Type: application/json`; this one was sent "
            f"{sent}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Browsers:
    """The rules of one listener: the names and origins its operator added, and whether every
    body it takes is JSON.

    ``hosts``: canonical names (``canonical_host``) a ``Host`` may name besides the loopback ones.
    ``origins``: canonical origins (``canonical_origin``) admitted besides the daemon's own.
    ``json_bodies``: every POST, PUT and PATCH this listener answers carries a JSON body (the
    agents' ports), so its media type is checked before the request goes further.
    """

    hosts: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()
    json_bodies: bool = False

    @classmethod
    def of(
        cls, hosts: Iterable[str] = (), origins: Iterable[str] = (), *, listen: str | None = None
    ) -> Browsers:
        """The rules from the operator's flags (``--allow-host``, ``--allow-origin``) and the
        ``--listen`` host, which names the daemon too unless it is every interface.

        Raises:
            ValueError: a name or an origin that is not one (``canonical_host``,
                ``canonical_origin``).
        """
        names = {canonical_host(name) for name in hosts}
        if listen is not None:
            own = _host_name(f"[{listen}]" if ":" in listen else listen)
            if own is not None and own not in _WILDCARDS:
                names.add(own)
        return cls(hosts=frozenset(names), origins=frozenset(map(canonical_origin, origins)))

    def names_daemon(self, host: str) -> bool:
        """Whether a ``Host`` value names this daemon."""
        name = _host_name(host)
        return name is not None and (_loopback(name) or name in self.hosts)

    def admits_origin(self, origin: str, host: str) -> bool:
        """Whether an ``Origin`` is the daemon's own (its authority is the ``Host``) or listed."""
        value = origin.strip().lower()
        scheme, found, authority = value.partition("://")
        if found and scheme in _DEFAULT_PORTS and authority == host.strip().lower():
            return True
        return value in self.origins

    def refusal(
        self,
        method: str,
        hosts: list[str],
        origins: list[str],
        content_type: str | None = None,
        *,
        websocket: bool = False,
    ) -> OperationRefused | None:
        """The refusal of a request by its method and the values of its ``Host``, ``Origin`` and
        ``Content-Type`` headers (each list as many as were sent), or None to let it through.

        A request sending two ``Host`` or two ``Origin`` headers is refused: no browser does, and
        a server and a proxy could each read another of them.
        """
        if len(hosts) != 1 or not self.names_daemon(hosts[0]):
            shown = excerpt(hosts[0]) if len(hosts) == 1 else f"{len(hosts)} Host headers"
            return OperationRefused(
                ErrorCode.FORBIDDEN,
                f"this daemon answers only requests whose Host names it (localhost or a loopback "
                f"address, or a name its operator allowed with --allow-host); this one names "
                f"{shown}, so it is refused: a page whose DNS name was pointed at this machine "
                f"must not drive it. Behind a reverse proxy, start salvor serve with "
                f"--allow-host and the proxy's public name",
            )
        if origins and (len(origins) != 1 or not self.admits_origin(origins[0], hosts[0])):
            shown = excerpt(origins[0]) if len(origins) == 1 else f"{len(origins)} Origin headers"
            return OperationRefused(
                ErrorCode.FORBIDDEN,
                f"this request came from a page of another origin ({shown}); the daemon takes "
                f"requests that carry an Origin only from its own pages (the origin its Host "
                f"names) or an origin its operator allowed with --allow-origin",
            )
        if self.json_bodies and not websocket and method.upper() in _WITH_BODY:
            try:
                json_media_type(media_type(content_type))
            except OperationRefused as refused:
                return refused
        return None


# The agents' ports (the model proxy, the MCP stand-ins, a service agent's port): loopback names
# only (they are handed out as 127.0.0.1 URLs), and every body JSON.
JSON_PORTS = Browsers(json_bodies=True)


def guarded(app: Any, browsers: Browsers) -> Any:
    """``app`` behind ``browsers``' rules: a refused HTTP request is answered with the error
    envelope and a refused WebSocket handshake with the same body (it never upgrades); ``app``
    never sees either."""

    async def guard(scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await app(scope, receive, send)
            return
        hosts, origins, content_type = [], [], None
        for name, value in scope["headers"]:
            if name == b"host":
                hosts.append(value.decode("latin-1"))
            elif name == b"origin":
                origins.append(value.decode("latin-1"))
            elif name == b"content-type" and content_type is None:
                content_type = value.decode("latin-1")
        websocket = scope["type"] == "websocket"
        refused = browsers.refusal(
            scope.get("method", "GET"), hosts, origins, content_type, websocket=websocket
        )
        if refused is None:
            await app(scope, receive, send)
            return
        body = json.dumps(refused.to_json(HTTP_WORDING), ensure_ascii=False).encode()
        head = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if not websocket:
            await send({"type": "http.response.start", "status": refused.status, "headers": head})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect: the handshake, which this answer refuses
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {"type": "websocket.http.response.start", "status": refused.status, "headers": head}
        )
        await send({"type": "websocket.http.response.body", "body": body})

    return guard
