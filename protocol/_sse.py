"""Server-sent events (the WHATWG ``text/event-stream`` format): one encoder, one decoder.

Every stream the daemon writes (the run event stream, client-run steps, the
model proxy's replayed frames, the MCP stand-in's pushes) is framed by
``sse_frame``; every stream it reads (a provider's answer, an MCP server's
events) is parsed by ``SSEDecoder``. Rules kept here:

* Lines end in CRLF, LF or CR; a CR at the end of a chunk waits for the next
  one, so a CRLF cut in two is one line end.
* ``data`` lines join with "\n"; a block with no ``data`` line dispatches
  nothing. A comment (a line starting with ":") is a keep-alive and carries
  nothing. ``id`` persists from event to event (unless it holds NUL),
  ``retry`` is kept when it is all ASCII digits, unknown fields are ignored.
* Unlike a browser, ``close()`` dispatches an event whose blank line never
  came: a provider that ends its stream on the last ``data`` line still
  delivers that event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\r|\n")
_TEXT_LINE_END = re.compile(r"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event.

    Its ``data`` lines joined, its ``event`` name (None when unnamed), the last id.
    """

    data: str
    event: str | None = None
    id: str | None = None


def _field(name: str, value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError(f"an SSE {name or 'comment'} cannot hold a line break")
    return f"{name}: {value}\n"


def sse_frame(
    data: str | None = None,
    *,
    event: str | None = None,
    id: int | str | None = None,
    retry: int | None = None,
    comment: str | None = None,
) -> bytes:
    """One frame, ended by its blank line.

    Its lines: ``: comment``, ``event``, ``id``, ``retry``, then each ``data`` line.

    ``data`` is split at its line breaks, one ``data:`` line each; a frame of
    a comment alone (``sse_frame(comment="keep-alive")``) is a keep-alive.

    Raises:
        ValueError: a line break in ``event``, ``id`` or ``comment``, or a NUL in ``id``.
    """
    out = ""
    if comment is not None:
        out += _field("", comment)
    if event is not None:
        out += _field("event", event)
    if id is not None:
        if "\0" in str(id):
            raise ValueError("an SSE id cannot hold NUL")
        out += _field("id", str(id))
    if retry is not None:
        out += f"retry: {int(retry)}\n"
    if data is not None:
        if "\n" in data or "\r" in data:
            out += "".join(f"data: {line}\n" for line in _TEXT_LINE_END.split(data))
        else:
            out += f"data: {data}\n"
    return (out + "\n").encode()


class SSEDecoder:
    """Turns an event stream's bytes or text, fed in pieces of any size, into ``ServerSentEvent``s.

    ``retry`` is the last valid reconnection time the stream named (ms), and
    ``pending`` how many bytes it holds toward events not yet dispatched (a
    reader's size cap checks it).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[str] = []
        self._data_bytes = 0
        self._event: str | None = None
        self._id: str | None = None
        self._started = False
        self.retry: int | None = None

    @property
    def pending(self) -> int:
        return len(self._buffer) + self._data_bytes

    def feed(self, chunk: bytes | str) -> list[ServerSentEvent]:
        """The events that end within ``chunk``, in order."""
        self._buffer += chunk.encode() if isinstance(chunk, str) else chunk
        if not self._started:
            if len(self._buffer) < len(_BOM) and _BOM.startswith(self._buffer):
                return []
            self._started = True
            if self._buffer.startswith(_BOM):
                del self._buffer[: len(_BOM)]
        return self._lines(final=False)

    def close(self) -> list[ServerSentEvent]:
        """The events still held when the stream ends.

        Its last line, and an event whose blank line never came.
        """
        self._started = True
        events = self._lines(final=True)
        if self._buffer:
            events += self._line(bytes(self._buffer))
            self._buffer.clear()
        return events + self._line(b"")

    def _lines(self, *, final: bool) -> list[ServerSentEvent]:
        buffer, events, start = self._buffer, [], 0
        while (end := _LINE_END.search(buffer, start)) is not None:
            if end.group() == b"\r" and end.end() == len(buffer) and not final:
                break  # the LF of a CRLF may be in the next chunk
            events += self._line(bytes(buffer[start : end.start()]))
            start = end.end()
        del buffer[:start]
        return events

    def _line(self, line: bytes) -> list[ServerSentEvent]:
        if not line:
            if not self._data:
                self._event = None
                return []
            event = ServerSentEvent("\n".join(self._data), self._event, self._id)
            self._data, self._data_bytes, self._event = [], 0, None
            return [event]
        if line.startswith(b":"):
            return []
        name, _, raw = line.partition(b":")
        raw = raw[1:] if raw.startswith(b" ") else raw
        value = raw.decode("utf-8", "replace")
        if name == b"data":
            self._data.append(value)
            self._data_bytes += len(raw) + 1
        elif name == b"event":
            self._event = value
        elif name == b"id":
            if "\0" not in value:
                self._id = value
        elif name == b"retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        return []
