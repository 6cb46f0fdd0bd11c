"""A real service for service-agent tests: an HTTP server whose model client is a real SDK.

``SERVICE`` is a small program (run with this interpreter as a subprocess)
that listens on a loopback port and, on ``POST /task``, runs a short tool
loop with the real ``openai`` or ``anthropic`` SDK. Its model base URL comes
from its environment, exactly as a developer would start a service
(``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``). It answers 200 with the
final text, or 500 when its model client raised (it swallows the error, as
a careless service would). Everything it sees goes to a journal file, one
JSON object a line: the trigger's headers and prompt, each finished
request's status, and a ``held`` mark when it pauses between model calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port

SERVICE = r"""
import json, os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

mode, port = sys.argv[1], int(sys.argv[2])
journal = Path(os.environ["JOURNAL"])
model_file = Path(os.environ["MODELFILE"]) if os.environ.get("MODELFILE") else None
release = Path(os.environ["RELEASE"]) if os.environ.get("RELEASE") else None
lock = threading.Lock()
held = []


def note(**entry):
    with lock, journal.open("a") as out:
        out.write(json.dumps(entry) + "\n")


def after_call():
    # With RELEASE set, the first request of this process pauses after its
    # first model call until the file exists (a test acts meanwhile).
    if release is None or held:
        return
    held.append(True)
    note(event="held")
    deadline = time.monotonic() + 30
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def run_task(prompt):
    model = model_file.read_text().strip() if model_file else "scripted-model"
    if mode == "openai":
        import openai

        client = openai.OpenAI(max_retries=0)
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "lookup_invoice",
                    "description": "Look up an invoice.",
                    "parameters": {"type": "object", "properties": {"invoice": {"type": "string"}}},
                },
            }
        ]
        messages = [{"role": "user", "content": prompt}]
        while True:
            message = (
                client.chat.completions.create(model=model, messages=messages, tools=tools)
                .choices[0]
                .message
            )
            after_call()
            if not message.tool_calls:
                return message.content or ""
            messages.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {
                                "name": c.function.name,
                                "arguments": c.function.arguments,
                            },
                        }
                        for c in message.tool_calls
                    ],
                }
            )
            for c in message.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"amount": 42})}
                )
    import anthropic

    client = anthropic.Anthropic(max_retries=0)
    tools = [
        {
            "name": "lookup_invoice",
            "description": "Look up an invoice.",
            "input_schema": {"type": "object", "properties": {"invoice": {"type": "string"}}},
        }
    ]
    messages = [{"role": "user", "content": prompt}]
    while True:
        reply = client.messages.create(model=model, max_tokens=256, messages=messages, tools=tools)
        after_call()
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in reply.content if b.type == "text")
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": b.text}
                    if b.type == "text"
                    else {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input}
                    for b in reply.content
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": u.id,
                        "content": json.dumps({"amount": 42}),
                    }
                    for u in uses
                ],
            }
        )


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        note(
            event="trigger",
            path=self.path,
            prompt=body.get("prompt"),
            headers={k.lower(): v for k, v in self.headers.items()},
        )
        try:
            status, answer = 200, {"reply": run_task(body["prompt"])}
        except Exception as exc:
            status, answer = 500, {"error": type(exc).__name__}
        note(event="finished", status=status)
        payload = json.dumps(answer).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the caller went away


server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
print("ready", flush=True)
server.serve_forever()
"""


@dataclass
class Service:
    """A running service: where to trigger it, and what it has seen so far."""

    process: subprocess.Popen
    port: int
    journal: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/task"

    def entries(self, event: str | None = None) -> list[dict]:
        if not self.journal.exists():
            return []
        rows = [json.loads(line) for line in self.journal.read_text().splitlines() if line]
        return [row for row in rows if event is None or row["event"] == event]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self.process.stdout.close()


def start_service(tmp_path: Path, mode: str, base_url: str, *, env: dict | None = None) -> Service:
    """Start ``SERVICE`` with its model base URL at ``base_url``; returns once it is listening.

    ``base_url`` is what a developer would export: ``http://127.0.0.1:<port>/v1``
    for an openai service, ``http://127.0.0.1:<port>`` for an anthropic one.
    """
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    journal = tmp_path / f"journal-{len(list(tmp_path.glob('journal-*')))}.jsonl"
    port = free_port()
    variable = "OPENAI_BASE_URL" if mode == "openai" else "ANTHROPIC_BASE_URL"
    full_env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SALVOR_", "OPENAI_", "ANTHROPIC_"))
        },
        variable: base_url,
        "OPENAI_API_KEY": "service-own-key",
        "ANTHROPIC_API_KEY": "service-own-key",
        "JOURNAL": str(journal),
        **(env or {}),
    }
    process = subprocess.Popen(
        [sys.executable, str(script), mode, str(port)],
        env=full_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line.strip() == "ready", f"the service did not start: {line!r}"
    return Service(process=process, port=port, journal=journal)


def service_definition(
    url: str, proxy_port: int, *, headers: dict | None = None, extra: str = ""
) -> str:
    """A ``kind = "service"`` definition in TOML."""
    table = "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in (headers or {}).items())
    return (
        f'name = "svc"\nkind = "service"\nurl = {json.dumps(url)}\nproxy_port '
        f"= {proxy_port}\ntimeout = 60\n"
        f"{extra}\n[headers]\n{table}"
    )
