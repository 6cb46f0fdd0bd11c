"""A lean HTTP/1.1 keep-alive client under trio (one request at a time per connection), so a
benchmark's load client costs little next to the daemon it measures.

httpx spends about a millisecond of CPU per request; on a small machine that would measure the
client, not the daemon. This one writes the request in one send and reads the answer by its
``Content-Length`` (the daemon's answers have one), on a connection kept open.
"""

from __future__ import annotations

import json

import trio


class Connection:
    """One kept-alive connection to the daemon, one request at a time."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream, self.host, self.buffer = stream, host, b""

    async def request(
        self, method: str, path: str, body: dict | None = None, headers: dict | None = None
    ) -> tuple[int, bytes]:
        payload = json.dumps(body).encode() if body is not None else b""
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self.host}",
            f"Content-Length: {len(payload)}",
        ]
        if body is not None:
            lines.append("Content-Type: application/json")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        await self.stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        while b"\r\n\r\n" not in self.buffer:
            await self._receive()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(self.buffer) < length:
            await self._receive()
        answer, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, answer

    async def _receive(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionError(f"{self.host} closed the connection before it answered")
        self.buffer += data


async def connect(base_url: str) -> Connection:
    host_port = base_url.split("://", 1)[1]
    host, port = host_port.rsplit(":", 1)
    return Connection(await trio.open_tcp_stream(host, int(port)), host_port)
