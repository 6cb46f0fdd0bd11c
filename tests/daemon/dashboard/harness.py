"""The harness the page-part tests drive: a loopback HTTP server and one browser on its page.

The server answers ``/ui/<name>`` from the package's static files (as ``salvor serve`` does) and
``/harness/<name>`` from ``harness/`` beside this file, every answer under the page's
Content-Security-Policy, so a part that needed an inline style or script would be refused here as
in the daemon (the harness records each refusal). It serves from a thread: it is test scaffolding,
not the daemon, and selenium blocks the test's thread anyway.
"""

from __future__ import annotations

import mimetypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import salvor.daemon.dashboard
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.browser import open_browser

STATIC = Path(salvor.daemon.dashboard.__file__).parent / "static"
HARNESS = Path(__file__).parent / "harness"
# The design's page headers, word for word.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "style-src 'self'; script-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}


def _asset(path: str) -> Path | None:
    for prefix, root in (("/ui/", STATIC), ("/harness/", HARNESS)):
        if path.startswith(prefix):
            name = path[len(prefix) :] or "index.html"
            # Only a plain name under the root: nothing above it is served.
            if "/" in name or name.startswith("."):
                return None
            found = root / name
            return found if found.is_file() else None
    return None


class _Server(ThreadingHTTPServer):
    # The browser opens several connections at once for the page's modules; socketserver's
    # backlog of 5 can drop one under load, and the page then waits on a SYN retried seconds on.
    request_queue_size = 64


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = _asset(self.path.split("?", 1)[0])
        if found is None:
            self.send_error(404)
            return
        body = found.read_bytes()
        kind = TYPES.get(found.suffix) or mimetypes.guess_type(found.name)[0] or "text/plain"
        self.send_response(200)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in PAGE_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass


@contextmanager
def harness_page(profile: Path) -> Iterator:
    """A browser on the harness page, its server on a loopback port; both stopped on leaving."""
    server = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, name="page-parts-harness", daemon=True)
    thread.start()
    try:
        with open_browser(profile) as driver:
            driver.get(f"http://127.0.0.1:{server.server_address[1]}/harness/index.html")
            # Module scripts run before the load event selenium waits for; a loaded machine is
            # given a moment more, and a module that failed says so in the browser's log.
            try:
                WebDriverWait(driver, 15).until(
                    lambda d: d.execute_script("return typeof window.harness") == "object"
                )
            except TimeoutException:
                raise AssertionError(
                    f"the harness did not load form.js and graph.js: {driver.get_log('browser')}"
                ) from None
            yield driver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
