"""Real MCP servers for the tests: the fixture server (stdio or HTTP), mcp-server-time,
server-everything, server-filesystem.

``FixtureServer`` is a directory the fixture server writes its evidence to:
``starts`` (one record per process start) and ``ledger`` (one record per
``tools/call`` it executed, written before the tool does anything).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

FIXTURE_SCRIPT = Path(__file__).with_name("mcp_fixture_server.py")
EVERYTHING = "mcp-server-everything"
EVERYTHING_INSTALL = "npm install -g @modelcontextprotocol/server-everything"
FILESYSTEM = "mcp-server-filesystem"
# The line of .ci/run that installs the npm servers the tests drive.
NPM_SERVERS_INSTALL = (
    "npm install -g @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem"
)


def time_server() -> str | None:
    """The ``mcp-server-time`` console script beside this interpreter
    (the test extra installs it)."""
    beside = Path(sys.executable).with_name("mcp-server-time")
    return str(beside) if beside.exists() else shutil.which("mcp-server-time")


def everything_server() -> str | None:
    return shutil.which(EVERYTHING)


def filesystem_server() -> str | None:
    return shutil.which(FILESYSTEM)


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class FixtureServer:
    dir: Path

    def command(self, *extra: str) -> list[str]:
        """The argv of a stdio fixture server writing to this directory."""
        return [sys.executable, str(FIXTURE_SCRIPT), "--dir", str(self.dir), *extra]

    def toml_command(self, *extra: str) -> str:
        return json.dumps(self.command(*extra))

    @property
    def starts(self) -> list[dict]:
        return _records(self.dir / "starts.jsonl")

    @property
    def ledger(self) -> list[dict]:
        return _records(self.dir / "ledger.jsonl")

    @property
    def received(self) -> list[dict]:
        """Every ``tools/call`` that reached the server, performed or not, with its ``_meta``."""
        return _records(self.dir / "received.jsonl")

    def received_of(self, tool: str) -> list[dict]:
        return [entry for entry in self.received if entry["tool"] == tool]

    def calls_of(self, tool: str) -> list[dict]:
        return [entry for entry in self.ledger if entry["tool"] == tool]

    @property
    def notifications(self) -> list[dict]:
        return _records(self.dir / "notifications.jsonl")

    @property
    def http_requests(self) -> list[dict]:
        return _records(self.dir / "http.jsonl")

    def hold(self, name: str) -> str:
        """A path a held call waits on; ``release(name)`` lets it go."""
        return str(self.dir / f"hold-{name}")

    def release(self, name: str) -> None:
        Path(self.hold(name)).write_text("go")


class HttpFixtureServer:
    """The fixture server over streamable HTTP on a loopback port, as a subprocess."""

    def __init__(
        self, fixture: FixtureServer, *extra: str, sse: bool = False, port: int = 0
    ) -> None:
        """``extra``: more of the fixture server's flags (``--find-note``)."""
        port_file = fixture.dir / f"port-{time.monotonic_ns()}"
        args = [
            *fixture.command("--http", "--port-file", str(port_file), "--port", str(port), *extra),
            *(["--sse"] if sse else []),
        ]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 15
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the HTTP fixture server did not start")
            time.sleep(0.01)
        self.port = int(port_file.read_text())
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
        self.process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _ListeningServer:
    """A server subprocess listening on a loopback port, ready once the port accepts."""

    def __init__(self, args: list[str], port: int, env: dict | None = None) -> None:
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        self.url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{args[0]} did not start listening") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
        self.process.wait()


class SdkHttpServer(_ListeningServer):
    """``mcp_sdk_server.py``: a server on the official MCP Python SDK, over streamable HTTP."""

    def __init__(self, *, json_response: bool = False) -> None:
        port = _free_port()
        script = Path(__file__).with_name("mcp_sdk_server.py")
        super().__init__(
            [sys.executable, str(script), str(port), *(["--json"] if json_response else [])], port
        )


class EverythingHttpServer(_ListeningServer):
    """``@modelcontextprotocol/server-everything`` over streamable HTTP."""

    def __init__(self, command: str) -> None:
        port = _free_port()
        super().__init__([command, "streamableHttp"], port, env={**os.environ, "PORT": str(port)})
