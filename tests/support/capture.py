"""A capture server: a real loopback HTTP listener that records every connection it accepts and
every request's head and body, and answers each with one canned reply.

A test that must prove the daemon sent nothing somewhere aims a definition at it and then reads
``connections`` (how many the daemon opened) and ``seen`` (every byte it was sent).
"""

from __future__ import annotations

import socket
import threading


class CaptureServer:
    """Counts connections and keeps each request (head and body) as sent."""

    def __init__(
        self, status: int = 200, body: bytes = b"{}", content_type: str = "application/json"
    ) -> None:
        self.connections = 0
        self.requests: list[bytes] = []
        self._reply = (
            f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def seen(self) -> bytes:
        """Every byte of every request, concatenated."""
        return b"".join(self.requests)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(5)
                try:
                    self.requests.append(self._read(conn))
                    conn.sendall(self._reply)
                except OSError:
                    pass

    @staticmethod
    def _read(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip() or 0)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
