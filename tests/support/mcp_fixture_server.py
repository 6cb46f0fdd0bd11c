"""A small real MCP server for the tests: stdio by default, streamable HTTP with ``--http``.

Standard library only, so it starts in a few tens of milliseconds. Each start
appends a line to ``DIR/starts.jsonl`` (how a test proves no server was
spawned), and each ``tools/call`` it executes appends a line to
``DIR/ledger.jsonl`` *before* doing anything else (the side-effect ledger a
test counts, with the request id the call came under). Every notification
a client sends is appended to ``DIR/notifications.jsonl``.

Tools:

* ``lookup`` (key): a read. ``write_note`` (text): a write.
  ``delete_everything``: the destructive tool tests stub out.
  Any tool given ``hold`` (a file path) blocks after its ledger line until
  that file exists: a test holds a call in flight with it. ``hold_before``
  blocks the same way before the ledger line: the call has reached the
  server (``DIR/received.jsonl`` has it, with its ``_meta``) and nothing of it
  was performed yet.
* ``park`` (salvor, is_error): a result whose ``_meta.salvor`` is ``salvor``.
* ``fail_soft``: an ``isError`` result.
* ``hang``: never answers. ``crash``: the process exits mid-call.
  ``garbage``: answers with a line that is not JSON. ``big`` (size): a large text.
* ``ask_client``: sends the client a ``sampling/createMessage`` request and
  returns the answer it got.

``--honour-keys`` makes the server honour ``_meta.salvor.idempotency_key`` as a payment API
does: a key its ledger already holds is answered again and not performed (no ledger line).
``--notify`` makes a stdio server send a ``notifications/message`` before
answering each ``tools/call``. ``--linger`` keeps a stdio server running after its stdin closes (as
a badly behaved server might). ``tools/list`` pages four tools at a time, so clients must follow
``nextCursor``. ``--extra-tool NAME`` adds a trivial tool of that name.
``--find-note`` adds ``find_note`` (text), a read of the ledger for a probe:
its ``structuredContent`` says whether a ``write_note`` of that text was
called (``found``) and, when it was, the ``note`` it answered.
With ``--http`` the server listens on 127.0.0.1 (``--port``, or an ephemeral
port; either is written to ``--port-file``), hands out an ``Mcp-Session-Id`` on ``initialize`` and
requires it after; ``--sse`` answers every request as an event stream, with
a log notification before the response.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAGE = 4
TOOLS = [
    ("lookup", "Look a key up.", {"key": {"type": "string"}}, ["key"], {"readOnlyHint": True}),
    ("write_note", "Append a note to the ledger.", {"text": {"type": "string"}}, ["text"], {}),
    (
        "delete_everything",
        "Delete everything (stubbed by careful operators).",
        {},
        [],
        {"destructiveHint": True},
    ),
    (
        "park",
        "Answer with a _meta.salvor request.",
        {"salvor": {}, "is_error": {"type": "boolean"}},
        [],
        {},
    ),
    ("fail_soft", "Answer with an isError result.", {}, [], {}),
    ("hang", "Never answer.", {}, [], {}),
    ("crash", "Exit in the middle of the call.", {}, [], {}),
    ("garbage", "Answer with a line that is not JSON.", {}, [], {}),
    ("big", "Answer with a large text.", {"size": {"type": "integer"}}, ["size"], {}),
    ("ask_client", "Ask the client to sample a message.", {}, [], {}),
]


class Fixture:
    def __init__(
        self,
        directory: Path,
        extra_tools: list[str],
        honour_keys: bool = False,
        find_note: bool = False,
    ) -> None:
        self.dir = directory
        self.extra = extra_tools
        self.honour_keys = honour_keys
        self.find_note = find_note
        self.lock = threading.Lock()
        self.client_answers: dict[str, dict] = {}
        self.answered = threading.Condition()

    def note(self, name: str, record: dict) -> None:
        with self.lock, open(self.dir / name, "a") as f:
            f.write(json.dumps(record) + "\n")

    def tool_list(self) -> list[dict]:
        tools = [
            {
                "name": name,
                "description": text,
                "inputSchema": {"type": "object", "properties": props, "required": required},
                **({"annotations": notes} if notes else {}),
            }
            for name, text, props, required, notes in TOOLS
        ]
        tools += [
            {"name": n, "description": "An extra tool.", "inputSchema": {"type": "object"}}
            for n in self.extra
        ]
        if self.find_note:
            tools.append(
                {
                    "name": "find_note",
                    "description": "Whether a note was written.",
                    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
                    "annotations": {"readOnlyHint": True},
                }
            )
        return tools

    def answer(self, message: dict, send, ask) -> dict | None:
        """The response to one request (None for a notification or a response)."""
        if "method" not in message:
            with self.answered:
                self.client_answers[str(message.get("id"))] = message
                self.answered.notify_all()
            return None
        if "id" not in message:
            self.note("notifications.jsonl", message)
            return None
        method, params, rid = message["method"], message.get("params") or {}, message["id"]

        def ok(result: dict) -> dict:
            return {"jsonrpc": "2.0", "id": rid, "result": result}

        if method == "initialize":
            return ok(
                {
                    "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "salvor-fixture", "version": "1"},
                }
            )
        if method == "ping":
            return ok({})
        if method == "tools/list":
            start = int(params.get("cursor") or 0)
            tools = self.tool_list()
            page = {"tools": tools[start : start + PAGE]}
            if start + PAGE < len(tools):
                page["nextCursor"] = str(start + PAGE)
            return ok(page)
        if method == "tools/call":
            if params.get("name") not in [t["name"] for t in self.tool_list()]:
                return {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {"code": -32602, "message": f"unknown tool {params.get('name')}"},
                }
            return ok(
                self.call(
                    params.get("name"),
                    params.get("arguments") or {},
                    params.get("_meta"),
                    send,
                    ask,
                    rid,
                )
            )
        return {
            "jsonrpc": "2.0",
            "id": rid,
            "error": {"code": -32601, "message": f"no method {method}"},
        }

    def performed_key(self, meta) -> bool:
        """Whether the call's idempotency key is one this server's ledger already performed."""
        salvor = meta.get("salvor") if isinstance(meta, dict) else None
        key = salvor.get("idempotency_key") if isinstance(salvor, dict) else None
        if not self.honour_keys or key is None or not (self.dir / "ledger.jsonl").exists():
            return False
        with self.lock:
            lines = (self.dir / "ledger.jsonl").read_text().splitlines()
        return any(
            ((json.loads(line).get("meta") or {}).get("salvor") or {}).get("idempotency_key") == key
            for line in lines
            if line.strip()
        )

    def call(self, name: str, args: dict, meta, send, ask, rid) -> dict:
        self.note("received.jsonl", {"tool": name, "arguments": args, "meta": meta})
        if isinstance(args.get("hold_before"), str):
            while not os.path.exists(args["hold_before"]):
                time.sleep(0.02)
        if not self.performed_key(meta):
            self.note(
                "ledger.jsonl",
                {"tool": name, "arguments": args, "meta": meta, "pid": os.getpid(), "id": rid},
            )
        if isinstance(args.get("hold"), str):
            while not os.path.exists(args["hold"]):
                time.sleep(0.02)

        def text(value: str, **extra) -> dict:
            return {"content": [{"type": "text", "text": value}], **extra}

        if name == "lookup":
            return text(f"value of {args.get('key')}")
        if name == "find_note":
            written = [
                entry
                for entry in map(json.loads, (self.dir / "ledger.jsonl").read_text().splitlines())
                if entry["tool"] == "write_note" and entry["arguments"].get("text") == args["text"]
            ]
            found = {"found": bool(written)}
            if written:
                found["note"] = {"content": [{"type": "text", "text": f"noted {args['text']}"}]}
            return text(json.dumps(found), structuredContent=found)
        if name == "write_note":
            return text(f"noted {args.get('text')}")
        if name == "park":
            return text(
                "parking", _meta={"salvor": args.get("salvor")}, isError=bool(args.get("is_error"))
            )
        if name == "fail_soft":
            return text("it went wrong", isError=True)
        if name == "hang":
            threading.Event().wait()
        if name == "crash":
            sys.stderr.write("fixture crashing on purpose\n")
            sys.stderr.flush()
            os._exit(3)
        if name == "garbage":
            send(b"this is not json\n")
            threading.Event().wait()
        if name == "big":
            return text("x" * int(args["size"]))
        if name == "ask_client":
            answer = ask(
                {
                    "jsonrpc": "2.0",
                    "id": "s1",
                    "method": "sampling/createMessage",
                    "params": {"messages": [], "maxTokens": 5},
                }
            )
            return text(json.dumps(answer, sort_keys=True))
        return text(f"{name} done")

    def wait_answer(self, rid: str, timeout: float = 10) -> dict | None:
        with self.answered:
            self.answered.wait_for(lambda: rid in self.client_answers, timeout)
            return self.client_answers.pop(rid, None)


def serve_stdio(fixture: Fixture, linger: bool, notify: bool = False) -> None:
    out_lock = threading.Lock()
    stdout = sys.stdout.buffer

    def send(data: bytes) -> None:
        with out_lock:
            stdout.write(data)
            stdout.flush()

    def send_message(message: dict) -> None:
        send(json.dumps(message).encode() + b"\n")

    def ask(request: dict) -> dict | None:
        send_message(request)
        return fixture.wait_answer(str(request["id"]))

    def handle(message: dict) -> None:
        try:
            if notify and message.get("method") == "tools/call":
                send_message(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/message",
                        "params": {
                            "level": "info",
                            "data": f"calling {message['params'].get('name')}",
                        },
                    }
                )
            response = fixture.answer(message, send, ask)
        except BrokenPipeError:
            return
        if response is not None:
            try:
                send_message(response)
            except BrokenPipeError:
                pass

    for line in sys.stdin.buffer:
        if line.strip():
            threading.Thread(target=handle, args=(json.loads(line),), daemon=True).start()
    if linger:
        threading.Event().wait()  # a badly behaved server: it outlives its client
    # End of input: the client is gone, and so is this server (even mid-call).
    os._exit(0)


def serve_http(fixture: Fixture, port_file: Path, sse: bool, port: int) -> None:
    sessions: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _plain(
            self, status: int, body: bytes = b"", content_type: str = "application/json", headers=()
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in headers:
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def do_DELETE(self) -> None:
            sessions.discard(self.headers.get("Mcp-Session-Id", ""))
            self._plain(200)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            message = json.loads(body)
            session = self.headers.get("Mcp-Session-Id")
            fixture.note(
                "http.jsonl",
                {
                    "method": message.get("method"),
                    "session": session,
                    "authorization": self.headers.get("Authorization"),
                    "protocol_version": self.headers.get("MCP-Protocol-Version"),
                },
            )
            headers = []
            if message.get("method") == "initialize":
                session = uuid.uuid4().hex
                sessions.add(session)
                headers.append(("Mcp-Session-Id", session))
            elif session not in sessions:
                self._plain(404 if session else 400, b'{"error": "unknown session"}')
                return
            streaming = sse or (message.get("params") or {}).get("name") == "ask_client"
            if streaming and "id" in message and "method" in message:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

                def event(msg: dict) -> None:
                    self.wfile.write(b"event: message\ndata: " + json.dumps(msg).encode() + b"\n\n")
                    self.wfile.flush()

                event(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/message",
                        "params": {"level": "info", "data": "working on it"},
                    }
                )

                def ask(request: dict) -> dict | None:
                    event(request)
                    return fixture.wait_answer(str(request["id"]))

                def send(data: bytes) -> None:
                    self.wfile.write(b"data: " + data.strip() + b"\n\n")
                    self.wfile.flush()

                response = fixture.answer(message, send, ask)
                event(response)
                return

            def send(data: bytes) -> None:
                self._plain(200, data)
                threading.Event().wait()

            response = fixture.answer(message, send, None)
            if response is None:
                self._plain(202, headers=headers)
            else:
                self._plain(200, json.dumps(response).encode(), headers=headers)

    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(port_file)
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--sse", action="store_true")
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--extra-tool", action="append", default=[])
    parser.add_argument("--find-note", action="store_true")
    parser.add_argument("--linger", action="store_true")
    parser.add_argument("--notify", action="store_true")
    parser.add_argument("--honour-keys", action="store_true")
    args = parser.parse_args()
    fixture = Fixture(
        args.dir, args.extra_tool, honour_keys=args.honour_keys, find_note=args.find_note
    )
    fixture.note(
        "starts.jsonl", {"pid": os.getpid(), "transport": "http" if args.http else "stdio"}
    )
    if args.http:
        serve_http(fixture, args.port_file, args.sse, args.port)
    else:
        serve_stdio(fixture, args.linger, args.notify)


if __name__ == "__main__":
    main()
