"""The control-plane API refuses bad input the same way everywhere: malformed
bodies, oversize bodies, unknown routes, wrong methods, missing or wrong
bearer tokens, definitions that would reach the daemon's files. Each refusal
is the one envelope, never a 500, and records nothing."""

from __future__ import annotations

import json
import re

from salvor.daemon.api._app import create_app

from tests.support.api import NOBODY, assert_error, get_run, register, rested, snapshot
from tests.support.api_server import TOKEN, Server

# The page's routes (tests/daemon/api/test_dashboard_routes.py checks they answer without auth).
PAGE_RULES = frozenset({"/", "/docs", "/ui/<name>"})

# -- bad input, everywhere ------------------------------------------------------------------


STRICT_ROUTES = [
    ("/v1/runs", "runs"),
    ("/v1/runs/{run}/resume", "resume"),
    ("/v1/runs/{run}/resolve", "resolve"),
    ("/v1/runs/{run}/abandon", "abandon"),
]
MALFORMED = [
    ("application/json", b"{not json"),
    ("application/json", b'{"input": 1,}'),
    ("application/json", b"\xff\xfe\x00"),
    ("application/json", b"[]"),
    ("application/json", b'"a string"'),
    ("application/json", b"42"),
    ("application/json", b"null"),
    ("application/json", b'{"unknown_field": 1}'),
    ("application/json", b'{"input": NaN}'),
    ("application/json", b'{"input": Infinity}'),
    ("application/json", b'{"output": -1e999}'),
    ("application/json", b'{"reason": "\\udc00"}'),
    ("application/json", b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("application/json", b'{"input": 1' + b"0" * 5000 + b"}"),
    ("application/json; charset=utf-8", b"{not json"),
]
# A body sent as something else than JSON (as a page of another site can send one, or none at
# all): 415, even when it holds JSON.
NOT_JSON = [
    ("text/plain", b'{"input": {"approved": true}}'),
    ("text/plain;charset=UTF-8", b'{"input": {"approved": true}}'),
    ("application/x-www-form-urlencoded", b"input=1"),
    ("multipart/form-data; boundary=x", b'{"input": {"approved": true}}'),
    ("application/toml", b"input = 1"),
    (None, b'{"input": {"approved": true}}'),
]


async def test_malformed_bodies_are_400_on_every_strict_route_and_record_nothing(
    server: Server, providers
):
    agent, provider = await register(server, providers, [("request_approval", {})])
    run_id, _ = await rested(server, agent)
    before = await snapshot(server)
    calls = provider.call_count
    for path, _ in STRICT_ROUTES:
        for content_type, body in MALFORMED:
            response = await server.client.post(
                path.format(run=run_id), content=body, headers={"Content-Type": content_type}
            )
            assert_error(response, 400, "bad_request")
        for content_type, body in NOT_JSON:
            headers = {"Content-Type": content_type} if content_type else {}
            response = await server.client.post(
                path.format(run=run_id), content=body, headers=headers
            )
            assert_error(response, 415, "unsupported_media_type")
    assert await snapshot(server) == before
    assert provider.call_count == calls
    assert (await get_run(server, run_id))["status"]["state"] == "suspended"


async def test_a_body_over_8_mb_is_413_and_records_nothing(server: Server, providers):
    agent, _ = await register(server, providers, [("request_approval", {})])
    run_id, _ = await rested(server, agent)
    before = await snapshot(server)
    filler = "x" * (8 * 1024 * 1024)
    big_json = json.dumps({"agent": agent, "input": filler}).encode()
    for path, _ in STRICT_ROUTES:
        response = await server.client.post(
            path.format(run=run_id), content=big_json, headers={"Content-Type": "application/json"}
        )
        assert_error(response, 413, "payload_too_large")
    big_toml = f'model = "m"\nsystem_prompt = "{filler}"\n'.encode()
    response = await server.client.post(
        "/v1/agents", content=big_toml, headers={"Content-Type": "application/toml"}
    )
    assert_error(response, 413, "payload_too_large")

    async def chunked():  # no Content-Length: the cap holds as the body streams in
        for _ in range(32):
            yield b"y" * (1024 * 1024)

    response = await server.client.post(
        "/v1/runs", content=chunked(), headers={"Content-Type": "application/json"}
    )
    assert_error(response, 413, "payload_too_large")
    assert await snapshot(server) == before
    # Just under the cap is an ordinary body.
    response = await server.client.post(
        f"/v1/runs/{run_id}/abandon", json={"reason": "r" * (8 * 1024 * 1024 - 100)}
    )
    assert response.status_code == 200


async def test_unknown_routes_and_wrong_methods_get_the_envelope(server: Server):
    for path in (
        "/index.html",
        "/v1",
        "/v2/runs",
        "/v1/run",
        "/v1/runs/x/y/z",
        f"/v1/runs/{NOBODY}/canvas",
        "/static/x",
    ):
        assert_error(await server.client.get(path), 404, "not_found")
    for method, path in (
        ("DELETE", "/v1/runs"),
        ("PUT", "/v1/agents"),
        ("PATCH", f"/v1/runs/{NOBODY}"),
        ("GET", f"/v1/runs/{NOBODY}/resume"),
        ("POST", "/v1/capabilities"),
        ("POST", f"/v1/runs/{NOBODY}/events"),
        ("DELETE", "/v1/agents/sha256:00"),
    ):
        assert_error(await server.client.request(method, path), 405, "method_not_allowed")
    assert await snapshot(server) == ([], [])


# -- auth -----------------------------------------------------------------------------------


def _routes(server: Server) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, parameters filled in: a new route cannot escape."""
    app = create_app(server.state)
    fill = {
        "run_id": NOBODY,
        "agent_hash": "sha256:" + "0" * 64,
        "graph_hash": "sha256:" + "0" * 64,
        "namespace": "team",
        "name": "triage",
    }
    routes = []
    for rule in app.url_map.iter_rules():
        if rule.rule in PAGE_RULES:
            continue  # the page's shell holds no data: served without auth
        assert rule.rule.startswith("/v1/") or rule.rule == "/metrics", f"{rule.rule} is unguarded"
        path = rule.rule
        for argument in rule.arguments:
            path = re.sub(rf"<(?:[^:<>]+:)?{argument}>", fill[argument], path)
        routes.extend((method, path) for method in sorted(rule.methods))
    assert len(routes) > 20
    return routes


async def test_every_route_needs_the_token_when_one_is_set(server_factory, providers):
    server = await server_factory(auth_token=TOKEN)
    # Hundreds of wrong tokens from one client, on purpose: here each must be an ordinary 401, so
    # the client is never slowed (the 429 past the limit is tests/daemon/api/test_token_tries.py's).
    server.state.failed_tries.limit = 10**9
    agent, provider = await register(server, providers)
    before = await snapshot(server)
    # The login is the one route open without a token (tests/daemon/api/test_session.py).
    routes = [route for route in _routes(server) if route != ("POST", "/v1/session")]
    routes += [("GET", "/v1/nowhere"), ("DELETE", "/v1/runs")]
    anonymous = server.new_client()
    wrong = [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer  {TOKEN} extra"},
        {"X-Api-Key": TOKEN},
    ]
    body = json.dumps({"agent": agent, "input": None, "output": 1, "reason": "x"}).encode()
    for method, path in routes:
        for headers in wrong:
            response = await anonymous.request(
                method,
                path,
                headers={"Content-Type": "application/json", **headers},
                content=body if method == "POST" else None,
            )
            assert response.status_code == 401, (method, path, headers, response.text)
            if method != "HEAD":
                assert_error(response, 401, "unauthorized")
    assert await snapshot(server) == before
    assert provider.call_count == 0

    # The right token opens every route (whatever the route then answers, it is not 401).
    for method, path in routes:
        response = await server.client.request(
            method,
            path,
            headers={"Content-Type": "application/json"},
            content=body if method == "POST" else None,
        )
        assert response.status_code != 401, (method, path, response.text)
        assert response.status_code < 500, (method, path, response.text)
    run_id, done = await rested(server, agent)
    assert done["status"]["state"] == "completed"
    lowercase_scheme = await anonymous.get(
        f"/v1/runs/{run_id}", headers={"Authorization": f"bearer {TOKEN}"}
    )
    assert lowercase_scheme.status_code == 200


async def test_an_agent_sent_over_http_cannot_make_the_daemon_read_its_files(
    server: Server, tmp_path
):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not leak")
    definition = f'model = "m"\nsystem_prompt_path = "{secret}"\n'
    response = await server.client.post(
        "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
    )
    assert response.status_code == 400
    body = response.json()["error"]
    assert body["code"] == "bad_request" and "system_prompt_path" in body["message"]
    assert "do not leak" not in response.text
    assert (await server.client.get("/v1/agents")).json() == {"agents": []}
