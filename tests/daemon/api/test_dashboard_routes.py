"""The page over HTTP: ``/`` and ``/ui/<name>``, their headers, their 404, no auth needed."""

from __future__ import annotations

import re

import pytest
from salvor.daemon.dashboard._assets import STATIC

from tests.support.api import assert_error
from tests.support.api_server import TOKEN
from tests.support.backends import SQLITE_ONLY

STORE_BACKENDS = SQLITE_ONLY

CSP = (
    "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; frame-ancestors 'none'"
)


def assert_page_headers(response) -> None:
    assert response.headers["Content-Security-Policy"] == CSP
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "no-referrer"


@pytest.mark.parametrize("token", [None, TOKEN])
async def test_the_page_is_served_without_auth_and_with_its_headers(server_factory, token) -> None:
    server = await server_factory(auth_token=token)
    anonymous = server.new_client()
    index = await anonymous.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert index.content == (STATIC / "index.html").read_bytes()
    assert_page_headers(index)
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
        response = await anonymous.get(f"/ui/{name}")
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith(kind)
        assert response.content == (STATIC / name).read_bytes()
        assert_page_headers(response)
    # The data behind the page still needs the token.
    if token is not None:
        assert_error(await anonymous.get("/v1/runs"), 401, "unauthorized")


@pytest.mark.parametrize(
    "path",
    ["/ui/nowhere.js", "/ui/_assets.py", "/ui/.hidden.js", "/ui/a/b.js", "/ui/%2e%2e"],
)
async def test_a_name_the_page_has_no_file_for_is_the_404_envelope(server_factory, path) -> None:
    server = await server_factory(auth_token=TOKEN)
    response = await server.new_client().get(path)
    assert_error(response, 404, "not_found")
    assert_page_headers(response)


async def test_the_page_is_not_in_the_api_document(server) -> None:
    document = (await server.client.get("/v1/openapi.json")).json()
    assert [p for p in document["paths"] if not p.startswith("/v1/") and p != "/metrics"] == []


@pytest.mark.parametrize("token", [None, TOKEN])
async def test_the_reference_is_served_as_the_page_is_and_its_document_keeps_its_rule(
    server_factory, token
) -> None:
    """``/docs`` is a shell like ``/`` (no auth, the page's headers, files from the package); the
    document it draws is ``/v1/openapi.json``, which still needs the token when the daemon has
    one."""
    server = await server_factory(auth_token=token)
    anonymous = server.new_client()
    shell = await anonymous.get("/docs")
    assert shell.status_code == 200 and shell.headers["content-type"].startswith("text/html")
    assert shell.content == (STATIC / "docs.html").read_bytes()
    assert_page_headers(shell)
    assert b'<script type="module" src="/ui/docs.js">' in shell.content
    for name in ("docs.html", "docs.js", "docs.css"):
        # Everything it loads is the daemon's own: no CDN, no font or script from elsewhere.
        assert not re.search(rb"(https?:)?//[a-z0-9]", (STATIC / name).read_bytes()), name
    for name in ("docs.js", "docs.css", "dom.js", "login.js", "api.js"):
        response = await anonymous.get(f"/ui/{name}")
        assert response.status_code == 200 and response.content == (STATIC / name).read_bytes()
    document = await anonymous.get("/v1/openapi.json")
    if token is None:
        assert document.status_code == 200 and "/v1/runs" in document.json()["paths"]
    else:
        assert_error(document, 401, "unauthorized")
        assert (await server.client.get("/v1/openapi.json")).status_code == 200
