"""The stdio transport of an MCP session: a server spawned in a process group of its own.

The server starts tied to the daemon's life (``_spawn``), with an
allow-listed environment (``_child_env``) and its definition's ``env``.

Messages are newline-delimited JSON on the server's stdin and stdout; its
stderr is drained, and the tail is quoted when it dies. Closing ends its
stdin (the specification's way to ask a stdio server to exit), gives it a
moment, and kills whatever is left of its process group.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping

import trio

from ..processes import OWNER_VAR, child_environment, kill_group, open_tied_process, owner_mark
from ._definition import McpServerSpec
from ._session import (
    MAX_MESSAGE_BYTES,
    McpError,
    McpNoAnswer,
    McpSession,
    McpUnavailable,
    Reply,
    Transport,
    encode,
    excerpt,
)

STDERR_TAIL_BYTES = 2000
# How long a stdio server has to exit after its stdin closes before its group is killed.
CLOSE_GRACE_SECONDS = 1.0


class StdioTransport(Transport):
    def __init__(self, name: str, process: trio.Process, nursery: trio.Nursery) -> None:
        self.name = name
        self.process = process
        self._nursery = nursery
        self._write_lock = trio.Lock()
        self.stderr_tail = b""

    async def _write(self, message: dict) -> None:
        data = encode(message)
        if len(data) > MAX_MESSAGE_BYTES:
            raise McpUnavailable(
                self.name,
                f"was not sent a {len(data)}-byte message: the cap is {MAX_MESSAGE_BYTES} bytes",
            )
        async with self._write_lock:
            try:
                await self.process.stdin.send_all(data + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise McpUnavailable(
                    self.name, "has closed its stdin (its process has exited)"
                ) from None

    async def send(self, session: McpSession, message: dict, reply: Reply | None) -> None:
        await self._write(message)

    async def answer(self, session: McpSession, message: dict) -> None:
        # Written by a task of its own, so the reader never waits on a server that is not reading.
        async def write() -> None:
            try:
                await self._write(message)
            except McpError:
                pass

        self._nursery.start_soon(write)

    async def read_messages(self, session: McpSession) -> None:
        buffer = bytearray()
        stream = self.process.stdout
        try:
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if len(line) > MAX_MESSAGE_BYTES:
                        session.fail(
                            McpNoAnswer(
                                self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap"
                            )
                        )
                        return
                    if not line.strip():
                        continue
                    try:
                        message = json.loads(line)
                    except (ValueError, RecursionError):
                        session.fail(
                            McpNoAnswer(
                                self.name,
                                f"wrote a line to stdout that is not JSON: {excerpt(line)}",
                            )
                        )
                        return
                    await session.deliver(message)
                if len(buffer) > MAX_MESSAGE_BYTES:
                    session.fail(
                        McpNoAnswer(
                            self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap"
                        )
                    )
                    return
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        if session.broken is not None:
            return
        with trio.move_on_after(1.0):
            await self.process.wait()
        code = self.process.returncode
        how = (
            "closed its stdout"
            if code is None
            else f"exited with code {code}"
            if code >= 0
            else f"was killed by signal {-code}"
        )
        tail = self.stderr_tail.decode("utf-8", errors="replace").strip()
        said = f"; its stderr ended with: {tail[-500:]}" if tail else ""
        session.fail(McpNoAnswer(self.name, f"{how}{said}"))

    async def drain_stderr(self) -> None:
        try:
            while chunk := await self.process.stderr.receive_some(65536):
                self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL_BYTES:]
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    async def aclose(self) -> None:
        process = self.process
        try:
            await process.stdin.aclose()  # end of input asks a stdio server to exit
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        with trio.move_on_after(CLOSE_GRACE_SECONDS):
            await process.wait()
        # Whatever is left of its group (the server, or children it started) goes with it.
        kill_group(process.pid)
        await process.wait()
        await process.stdout.aclose()
        await process.stderr.aclose()


def server_environment(spec: McpServerSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """A stdio server's environment: the allow-list of the daemon's (``_child_env``),
    then the definition's ``env``."""
    env = child_environment(environ)
    env.update(spec.env)
    return env


def missing_program(spec: McpServerSpec, environ: Mapping[str, str]) -> str | None:
    """Why the program a stdio server names cannot be started, or None when it can be.

    Looked up as the spawn will: a name with a slash relative to the server's
    ``cwd``, a bare name on the ``PATH`` of the server's environment.
    """
    if spec.command is None:
        return None
    program = spec.command[0]
    if "/" in program:
        found = os.path.join(spec.cwd or os.getcwd(), program)
        if not (os.path.isfile(found) and os.access(found, os.X_OK)):
            return (
                f"MCP server {spec.name!r}: its command {program[:120]!r} is not an executable file"
            )
        return None
    if (
        shutil.which(program, path=server_environment(spec, environ).get("PATH", os.defpath))
        is None
    ):
        return f"MCP server {spec.name!r}: its command {program[:120]!r} is not found on PATH"
    return None


async def open_stdio(
    spec: McpServerSpec, nursery: trio.Nursery, environ: Mapping[str, str], mark: Mapping[str, str]
) -> McpSession:
    """Spawn the server with ``mark`` in its environment (how a later sweep finds it orphaned)."""
    env = server_environment(spec, environ)
    env.update(mark)
    if mark:
        env[OWNER_VAR] = (
            owner_mark()
        )  # a sweep by another salvor spares it while this process lives
    try:
        process = await open_tied_process(
            spec.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=spec.cwd,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        raise McpUnavailable(
            spec.name, f"could not be started ({spec.command[0]}): {exc.strerror or exc}"
        ) from None
    transport = StdioTransport(spec.name, process, nursery)
    session = McpSession(spec, transport)
    nursery.start_soon(transport.drain_stderr)
    nursery.start_soon(transport.read_messages, session)
    return session
