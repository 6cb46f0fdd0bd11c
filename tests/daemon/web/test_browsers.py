"""The browser rules as a pure decision (``salvor.daemon.web.Browsers``): one table of requests
(method, Host, Origin, Content-Type) and what each listener answers them, and the operator's
names and origins as ``salvor serve`` reads them. The same rules over real HTTP are
tests/daemon/api/test_browsers.py's, in a real browser tests/daemon/dashboard/test_cross_site.py's.
"""

from __future__ import annotations

import pytest
from salvor.daemon.web import JSON_PORTS, Browsers, canonical_host, canonical_origin

DAEMON = "127.0.0.1:8420"
OWN = f"http://{DAEMON}"
# The operator's: a reverse proxy's name, and a second page allowed to call the API.
OPERATOR = Browsers.of(["salvor.example.com"], ["https://ops.example.com"], listen="127.0.0.1")

# (method, Host values, Origin values, Content-Type, refused by the control plane's rules)
REQUESTS = [
    # The loopback names and addresses, with any port or none.
    ("GET", [DAEMON], [], None, None),
    ("GET", ["localhost:8420"], [], None, None),
    ("GET", ["LOCALHOST"], [], None, None),
    ("GET", ["127.0.0.1"], [], None, None),
    ("GET", ["127.9.9.9:1"], [], None, None),
    ("GET", ["[::1]:8420"], [], None, None),
    ("GET", ["[0:0:0:0:0:0:0:1]"], [], None, None),
    ("GET", ["localhost:9000"], [], None, None),  # an ssh -L forward keeps its own port
    # A rebound name, names that only look loopback, and no Host or two.
    ("GET", ["rebound.test:8420"], [], None, "Host"),
    ("GET", ["attacker.example"], [], None, "Host"),
    ("GET", ["app.localhost:8420"], [], None, "Host"),
    ("GET", ["localhost.:8420"], [], None, "Host"),
    ("GET", ["127.1:8420"], [], None, "Host"),
    ("GET", ["0x7f.0.0.1:8420"], [], None, "Host"),
    ("GET", ["192.0.2.7:8420"], [], None, "Host"),
    ("GET", ["localhost:8420:1"], [], None, "Host"),
    ("GET", ["localhost:99999999"], [], None, "Host"),
    ("GET", ["[::1"], [], None, "Host"),
    ("GET", [""], [], None, "Host"),
    ("GET", [], [], None, "Host"),
    ("GET", [DAEMON, "rebound.test"], [], None, "Host"),
    # The operator's name, with any port, and the daemon's own page behind it.
    ("GET", ["salvor.example.com"], [], None, None),
    ("POST", ["Salvor.Example.COM:443"], ["https://salvor.example.com:443"], None, None),
    ("GET", ["other.example.com"], [], None, "Host"),
    # The daemon's own origin (http or https: a proxy that ends TLS), and the operator's.
    ("POST", [DAEMON], [OWN], None, None),
    ("POST", [DAEMON], [f"https://{DAEMON}"], None, None),
    ("POST", ["localhost:8420"], ["http://localhost:8420"], None, None),
    ("POST", [DAEMON], ["https://ops.example.com"], None, None),
    ("POST", [DAEMON], ["HTTPS://OPS.EXAMPLE.COM"], None, None),
    # Every other origin, whatever the method: another port is another origin.
    ("POST", [DAEMON], ["http://127.0.0.1:8421"], None, "Origin"),
    ("POST", [DAEMON], ["http://localhost:8420"], None, "Origin"),
    ("POST", [DAEMON], ["http://ops.example.com"], None, "Origin"),
    ("POST", [DAEMON], ["https://ops.example.com:8443"], None, "Origin"),
    ("POST", [DAEMON], ["null"], None, "Origin"),
    ("POST", [DAEMON], ["file://"], None, "Origin"),
    ("DELETE", [DAEMON], ["https://evil.example"], None, "Origin"),
    ("GET", [DAEMON], ["https://evil.example"], None, "Origin"),
    ("POST", [DAEMON], [OWN, "https://evil.example"], None, "Origin"),
    # The control plane leaves a body's type to the route that reads it.
    ("POST", [DAEMON], [], "text/plain", None),
    ("POST", [DAEMON], [], None, None),
]


@pytest.mark.parametrize(("method", "hosts", "origins", "content_type", "refused"), REQUESTS)
def test_the_control_plane_admits_its_own_names_and_origins_only(
    method, hosts, origins, content_type, refused
) -> None:
    refusal = OPERATOR.refusal(method, hosts, origins, content_type)
    if refused is None:
        assert refusal is None, refusal.message
        return
    assert refusal is not None and (refusal.code, refusal.status) == ("forbidden", 403)
    if refused == "Host":
        assert "answers only requests whose Host names it" in refusal.message
    else:
        assert "came from a page of another origin" in refusal.message


def test_a_websocket_handshake_is_held_to_the_same_rules() -> None:
    assert OPERATOR.refusal("GET", [DAEMON], [OWN], websocket=True) is None
    for hosts, origins in (
        ([DAEMON], ["http://127.0.0.1:9999"]),
        (["rebound.test:8420"], ["http://rebound.test:8420"]),
    ):
        assert OPERATOR.refusal("GET", hosts, origins, websocket=True).code == "forbidden"


# (method, Content-Type, refused) on a listener whose every body is JSON (the agents' ports)
AGENT_PORT_BODIES = [
    ("POST", "application/json", False),
    ("POST", "application/json; charset=utf-8", False),
    ("POST", "Application/JSON;charset=UTF-8", False),
    ("POST", "application/vnd.example+json", False),
    ("POST", None, True),
    ("POST", "", True),
    ("POST", "text/plain", True),
    ("POST", "text/plain;charset=UTF-8", True),
    ("POST", "application/x-www-form-urlencoded", True),
    ("POST", "multipart/form-data; boundary=x", True),
    ("POST", "text/json", True),
    ("PUT", "text/plain", True),
    ("PATCH", None, True),
    # No body: an MCP push stream, the end of an MCP session, the model list.
    ("GET", None, False),
    ("DELETE", None, False),
]


@pytest.mark.parametrize(("method", "content_type", "refused"), AGENT_PORT_BODIES)
def test_the_agents_ports_take_json_bodies_only(method, content_type, refused) -> None:
    refusal = JSON_PORTS.refusal(method, [DAEMON], [], content_type)
    if not refused:
        assert refusal is None, refusal.message
        return
    assert (refusal.code, refusal.status) == ("unsupported_media_type", 415)
    assert "Content-Type: application/json" in refusal.message


def test_the_agents_ports_take_loopback_names_and_no_page() -> None:
    """What an agent's SDK sends passes; a page, or an operator's name, does not."""
    assert JSON_PORTS.refusal("POST", ["127.0.0.1:4646"], [], "application/json") is None
    assert JSON_PORTS.refusal("POST", ["localhost:4646"], [], "application/json") is None
    for hosts, origins in (
        (["salvor.example.com"], []),
        (["rebound.test:4646"], []),
        (["127.0.0.1:4646"], ["http://127.0.0.1:8000"]),
    ):
        refusal = JSON_PORTS.refusal("POST", hosts, origins, "application/json")
        assert refusal is not None and refusal.code == "forbidden"
    # Even a page on the port's own origin cannot send it a body a form could carry.
    refusal = JSON_PORTS.refusal("POST", ["127.0.0.1:4646"], ["http://127.0.0.1:4646"], None)
    assert refusal.code == "unsupported_media_type"


def test_the_listen_host_names_the_daemon_unless_it_is_every_interface() -> None:
    assert Browsers.of(listen="salvor.lan").names_daemon("salvor.lan:8420")
    assert Browsers.of(listen="192.0.2.7").names_daemon("192.0.2.7:8420")
    assert Browsers.of(listen="fd00::7").names_daemon("[fd00:0::7]:8420")
    for everywhere in ("0.0.0.0", "::", ""):
        assert Browsers.of(listen=everywhere).hosts == frozenset()


# What the operator writes, and the form it is compared in (None: refused, exit 2).
HOSTS = [
    ("salvor.example.com", "salvor.example.com"),
    ("Salvor.Example.COM", "salvor.example.com"),
    ("192.0.2.7", "192.0.2.7"),
    ("fd00::1", "[fd00::1]"),
    ("[FD00:0::1]", "[fd00::1]"),
    ("salvor.example.com:443", None),
    ("*.localhost", None),
    ("https://salvor.example.com", None),
    ("", None),
    ("salvor example", None),
]
ORIGINS = [
    ("https://ops.example.com", "https://ops.example.com"),
    ("https://ops.example.com/", "https://ops.example.com"),
    ("HTTPS://Ops.Example.com:443", "https://ops.example.com"),
    ("http://ops.example.com:80", "http://ops.example.com"),
    ("http://127.0.0.1:3000", "http://127.0.0.1:3000"),
    ("http://[::1]:3000", "http://[::1]:3000"),
    ("ops.example.com", None),
    ("ftp://ops.example.com", None),
    ("https://ops.example.com/app", None),
    ("https://user@ops.example.com", None),
    ("https://ops.example.com?x", None),
    ("null", None),
]


@pytest.mark.parametrize(("given", "canonical"), HOSTS)
def test_an_allowed_host_is_a_name_without_a_port(given, canonical) -> None:
    if canonical is not None:
        assert canonical_host(given) == canonical
        return
    with pytest.raises(ValueError, match="--allow-host takes a host name") as refused:
        canonical_host(given)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("given", "canonical"), ORIGINS)
def test_an_allowed_origin_is_as_a_browser_sends_it(given, canonical) -> None:
    if canonical is not None:
        assert canonical_origin(given) == canonical
        assert Browsers.of(origins=[given]).admits_origin(canonical, "127.0.0.1:8420")
        return
    with pytest.raises(ValueError, match="--allow-origin takes an origin"):
        canonical_origin(given)
