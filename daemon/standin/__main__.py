"""The stdio stand-in an agent spawns in place of an MCP server: ``python
-m salvor.daemon.standin RELAY_FILE``.

``SALVOR_MCP_SERVER_<NAME>`` is this command line. ``RELAY_FILE`` holds the URL
of the run's stand-in endpoint on the daemon's loopback listener
(``_mcp_endpoint``), a capability: it is never on the command line, which
every local user can read in ``/proc/<pid>/cmdline``, and the file is the
daemon user's alone (0600, in a 0700 directory that lives as long as the
drive). Nor does it come in the environment: MCP clients spawn their servers
with a scrubbed one. It relays, one request at
a time and in order, each newline-delimited JSON-RPC request the agent writes
to its stdin as a POST to that URL and writes what comes back
(the server notifications due, then the answer) to its stdout, a line each.
A request the real server sends the agent (sampling, elicitation, roots)
comes over the endpoint's push stream (a ``GET`` held open) and is written
out the same way; the agent's answer is posted at once, ahead of any queued
request. The daemon does the recording; this process holds
no state and is safe to kill at any instant. It ends when its stdin does.

Standard library only (and nothing from salvor), so it starts quickly in
whatever environment an MCP client gives the servers it spawns. A daemon it
cannot reach is answered, for each request, with a JSON-RPC error naming it.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
from queue import Queue
from urllib.parse import urlsplit

UNREACHABLE = -32000
RELAY_HEADER = (
    "x-salvor-relay"  # the daemon then answers with every message due (notifications first)
)


class Relay:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise SystemExit(
                "salvor's MCP stand-in needs the http:// URL of its endpoint in its relay file"
            )
        self.url = url
        self.host, self.port, self.path = parts.hostname, parts.port or 80, parts.path
        self.connection: http.client.HTTPConnection | None = None

    def post(self, line: bytes) -> tuple[int, bytes]:
        # One retry on a fresh connection: a kept-alive one the daemon closed fails on first use.
        for attempt in (1, 2):
            if self.connection is None:
                self.connection = http.client.HTTPConnection(self.host, self.port)
            try:
                self.connection.request(
                    "POST",
                    self.path,
                    body=line,
                    headers={
                        "content-type": "application/json",
                        "accept": "application/json",
                        RELAY_HEADER: "1",
                    },
                )
                response = self.connection.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException):
                self.connection.close()
                self.connection = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def _failure(line: bytes, message: str) -> bytes | None:
    """A JSON-RPC error for the request on ``line``; None when it was no
    request (nothing to answer)."""
    try:
        sent = json.loads(line)
    except ValueError:
        sent = None
    if not (isinstance(sent, dict) and "id" in sent and isinstance(sent.get("method"), str)):
        return None
    answer = {
        "jsonrpc": "2.0",
        "id": sent["id"],
        "error": {"code": UNREACHABLE, "message": message},
    }
    return json.dumps(answer, separators=(",", ":")).encode()


def _refusal_text(body: bytes) -> str | None:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return (
        error.get("message")
        if isinstance(error, dict) and isinstance(error.get("message"), str)
        else None
    )


def _messages(body: bytes | None) -> list[bytes]:
    """The lines to write for a body: each element of the array the daemon answers a relay with."""
    if not body or not body.strip():
        return []
    try:
        parsed = json.loads(body)
    except ValueError:
        return [body.strip().replace(b"\n", b" ")]
    items = parsed if isinstance(parsed, list) else [parsed]
    return [json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode() for item in items]


def _goes_at_once(line: bytes) -> bool:
    """Whether the agent wrote something that must not queue behind a call in flight.

    An answer to one of the server's requests (the call is waiting on it),
    or a notification (a ``notifications/cancelled`` names the call in
    flight; none of them gets an answer to wait for).
    """
    try:
        sent = json.loads(line)
    except ValueError:
        return False
    return isinstance(sent, dict) and ("method" not in sent or "id" not in sent)


def _listen(relay: Relay, write) -> None:
    """Write each message of the daemon's push stream (the server's
    requests to the agent) as a line."""
    try:
        connection = http.client.HTTPConnection(relay.host, relay.port)
        connection.request("GET", relay.path, headers={"accept": "text/event-stream"})
        response = connection.getresponse()
        if response.status != 200:
            return
        data: list[bytes] = []
        while line := response.readline():
            line = line.rstrip(b"\r\n")
            if line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))
            elif not line and data:
                write(_messages(b"\n".join(data)))
                data = []
    except (OSError, http.client.HTTPException):
        return


def _exchange(relay: Relay, line: bytes) -> list[bytes]:
    """POST one line; the lines to write back."""
    try:
        status, body = relay.post(line)
    except (OSError, http.client.HTTPException) as exc:
        body = _failure(
            line, f"salvor's MCP stand-in could not reach the daemon at {relay.url}: {exc}"
        )
    else:
        if status >= 400:
            # A refusal names no request id (e.g. an oversized line): answer the request it refused.
            body = (
                _failure(
                    line,
                    _refusal_text(body) or f"salvor's MCP stand-in was refused with HTTP {status}",
                )
                or body
            )
    return _messages(body)


def endpoint_of(relay_file: str) -> str:
    """The endpoint URL ``relay_file`` holds.

    Raises:
        SystemExit: a URL given in place of the file, or a file that cannot be read.
    """
    if "://" in relay_file:
        raise SystemExit(
            "salvor's MCP stand-in takes the file holding its endpoint's URL, never the URL "
            "itself: a command line is readable by every local user"
        )
    try:
        with open(relay_file, encoding="utf-8") as held:
            return held.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"salvor's MCP stand-in cannot read its relay file: {exc}") from None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m salvor.daemon.standin RELAY_FILE", file=sys.stderr)
        return 2
    url = endpoint_of(argv[1])
    calls, answers = Relay(url), Relay(url)
    out = sys.stdout.buffer
    lock = threading.Lock()

    def write(messages: list[bytes]) -> None:
        with lock:
            for message in messages:
                out.write(message + b"\n")
            out.flush()

    # Requests go one at a time, in order; the agent's answers to the server's requests and its
    # notifications go at once (see _goes_at_once).
    queue: Queue[bytes | None] = Queue()

    def post_in_order() -> None:
        while (line := queue.get()) is not None:
            write(_exchange(calls, line))

    threading.Thread(target=_listen, args=(calls, write), daemon=True).start()
    poster = threading.Thread(target=post_in_order)
    poster.start()
    for line in sys.stdin.buffer:
        line = line.strip()
        if not line:
            continue
        if _goes_at_once(line):
            write(_exchange(answers, line))
        else:
            queue.put(line)
    queue.put(None)
    poster.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
