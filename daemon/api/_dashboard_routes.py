"""The page: ``GET /`` (its ``index.html``), ``GET /docs`` (the API reference, ``docs.html``) and
``GET /ui/<name>`` (their other files).

No auth: the shell holds no data (everything it shows it asks ``/v1`` for, with the caller's
credentials; the reference reads ``/v1/openapi.json`` under that route's own rule). Every answer,
the 404 envelope for a name the page has no file for too, carries the page's security headers:
scripts, styles and connections from this origin only, nothing inline, no framing, no sniffing, no
referrer. These routes are not API and are not in the OpenAPI document, which describes ``/v1``.
"""

from __future__ import annotations

import trio
from quart import Response, request
from quart_trio import QuartTrio
from salvor.protocol import ErrorCode, excerpt

from ..dashboard import INDEX, REFERENCE, read_asset
from ..web import OperationRefused
from ._http import error_response

PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; "
        "script-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # A new daemon may ship a new page: the browser asks again rather than mixing versions.
    "Cache-Control": "no-cache",
}
ASSET_PREFIX = "/ui/"
REFERENCE_PATH = "/docs"


def is_page_path(path: str) -> bool:
    """Whether ``path`` is one of the page's (answered without auth)."""
    return path in ("/", REFERENCE_PATH) or path.startswith(ASSET_PREFIX)


def add_dashboard_routes(app: QuartTrio) -> None:
    @app.after_request
    async def page_headers(response: Response) -> Response:
        # Here rather than in the handlers, so a page path no route matches (``/ui/a/b``) and its
        # 404 envelope carry them too.
        if is_page_path(request.path):
            response.headers.update(PAGE_HEADERS)
        return response

    @app.get("/")
    async def index():
        return await _asset(INDEX)

    @app.get(REFERENCE_PATH)
    async def reference():
        return await _asset(REFERENCE)

    @app.get(ASSET_PREFIX + "<name>")
    async def asset(name: str):
        return await _asset(name)


async def _asset(name: str) -> Response:
    found = await trio.to_thread.run_sync(read_asset, name)
    if found is None:
        return error_response(
            OperationRefused(ErrorCode.NOT_FOUND, f"the page has no file {excerpt(name)!r}")
        )
    return Response(found.body, status=200, content_type=found.content_type)
