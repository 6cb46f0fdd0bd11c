"""A webhook receiver for the notification tests: a real HTTP server on a loopback port.

It answers each POST with the next status of its script (the last one repeats), keeps every
request it got (headers and body) and counts them. ``hold()`` makes it take requests and answer
none until ``release()`` (a receiver that hangs); ``received`` lets a test wait for a count
without sleeping.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


class WebhookReceiver:
    def __init__(self, statuses=(200,)) -> None:
        self.statuses = list(statuses)
        self.requests: list[Received] = []
        self.answered: list[int] = []
        self._lock = threading.Condition()
        self._released = threading.Event()
        self._released.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.requests.append(
                        Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    index = min(len(receiver.requests), len(receiver.statuses)) - 1
                    status = receiver.statuses[index]
                    receiver._lock.notify_all()
                receiver._released.wait()
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/x")
                self.send_header("Content-Length", "0")
                self.end_headers()
                with receiver._lock:
                    receiver.answered.append(status)
                    receiver._lock.notify_all()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}/hook"
        # A short poll, so closing (which waits for the serving loop to look) is quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def accept_from_now(self) -> None:
        """Every later request is answered 200."""
        with self._lock:
            self.statuses = [*self.statuses[: len(self.requests)], 200]

    def wait_for(self, count: int, timeout: float = 30.0, *, answered: bool = False) -> bool:
        """Block until ``count`` requests arrived (or were answered); False past ``timeout``."""
        seen = (lambda: len(self.answered)) if answered else (lambda: len(self.requests))
        with self._lock:
            return self._lock.wait_for(lambda: seen() >= count, timeout)

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
