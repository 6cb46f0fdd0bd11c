"""A built-in agent's MCP servers as tools: connected on first use,
listed, called with declared effects.

``McpConnections`` holds the sessions of one drive (or one build): a server
is started or reached only when something first needs it, and every session
is closed when the drive ends. A drive that only replays recorded calls
therefore starts no server at all.

What a run's model is offered is pinned in its log: each server's listing is
one recorded ``read`` tool call (``mcp:<server>/tools/list``), made before the
first model call. A re-drive answers the listing from the log, so the tools in
every rebuilt request, and with them each recorded request hash, are exactly
the ones the run saw, whatever the server lists today.

Each exposed tool becomes a ``Tool`` with the operator's declared effect (an
undeclared one is a ``write``). A tool with a fixed result in ``results`` is
answered here and never forwarded. A result may park the run through
``_meta.salvor`` (``suspend`` or ``sleep_until``, as control-plane-api.md's
"A tool can start the timer" describes); a request that is malformed, names
both keys or an unknown one, or sits on an ``isError`` result fails the call,
never retried.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio
from salvor.protocol import (
    Effect,
    MalformedEvent,
    MalformedJson,
    check_schema,
    parse_instant,
    parse_strict,
)

from ..tools import NotPerformed, OutcomeUnknown, SleepUntil, Suspend, Tool, ToolCall, ToolFailed
from ..web import off_loop
from ._client import McpError, McpNoAnswer, McpRemoteError, McpSession, McpUnavailable, open_session
from ._definition import McpServerSpec

# MCP tool arguments are an object; the server checks the rest of its own schema.
_ARGUMENTS = {"type": "object"}
_SALVOR_KEYS = ("suspend", "sleep_until")
_SUSPEND_KEYS = {"reason", "input_schema", "kind"}
# What the model providers accept as a tool name (Anthropic and OpenAI alike).
_MODEL_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class McpBuildError(ValueError):
    """The agent's MCP servers do not add up to a buildable agent; the
    message says which and why."""


def listing_tool_name(server: str) -> str:
    """The name a server's recorded listing call carries in the log (no MCP
    tool name holds ``:``/``/``)."""
    return f"mcp:{server}/tools/list"


class McpConnections:
    """The MCP sessions of one drive: opened on first use, reopened after
    a failure, closed together."""

    def __init__(
        self,
        servers: tuple[McpServerSpec, ...],
        nursery: trio.Nursery,
        environ: Mapping[str, str],
        mark: Mapping[str, str],
    ) -> None:
        self._specs = {spec.name: spec for spec in servers}
        self._nursery = nursery
        self._environ = environ
        self._mark = mark
        self._sessions: dict[str, McpSession] = {}
        self._locks = {name: trio.Lock() for name in self._specs}

    def admit(self, spec: McpServerSpec) -> None:
        """Reach ``spec``'s server too from now on (one attached to the run at run time); a
        server of that name already here is kept as it is."""
        if spec.name not in self._specs:
            self._specs[spec.name] = spec
            self._locks[spec.name] = trio.Lock()

    async def session(self, server: str) -> McpSession:
        """The live session with ``server``, started now if there is none (or the last one ended).

        Raises:
            McpUnavailable: it could not be started, reached or initialised.
        """
        async with self._locks[server]:
            session = self._sessions.get(server)
            if session is not None and session.broken is None:
                return session
            if session is not None:
                await session.aclose()
                del self._sessions[server]
            session = await open_session(
                self._specs[server], self._nursery, self._environ, self._mark
            )
            self._sessions[server] = session
            return session

    async def list_tools(self, server: str) -> list[dict]:
        return await (await self.session(server)).list_tools()

    async def call_tool(self, server: str, tool: str, arguments: Any, meta: dict | None) -> dict:
        """One ``tools/call``; a request that never reached the server is sent
        once more on a new session."""
        try:
            return await (await self.session(server)).call_tool(tool, arguments, meta)
        except McpUnavailable:
            # Nothing was performed (e.g. an HTTP session the server forgot): one fresh try.
            return await (await self.session(server)).call_tool(tool, arguments, meta)

    async def aclose(self) -> None:
        for session in self._sessions.values():
            await session.aclose()
        self._sessions.clear()


@asynccontextmanager
async def open_connections(
    servers: tuple[McpServerSpec, ...],
    *,
    mark: Mapping[str, str],
    environ: Mapping[str, str] = os.environ,
) -> AsyncIterator[McpConnections]:
    """MCP connections for the body of the ``async with``; every session is closed at its end.

    ``mark``: the orphan mark every stdio server it spawns carries (``_orphans``).
    """
    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        connections = McpConnections(servers, nursery, environ, mark)
        try:
            yield connections
        except trio.Cancelled:
            raise
        except BaseException as exc:  # noqa: BLE001 -- re-raised below, unwrapped by the nursery
            failure = exc
        finally:
            await connections.aclose()
            nursery.cancel_scope.cancel(reason="the drive ended; its MCP connections close")
    if failure is not None:
        raise failure


# -- building -----------------------------------------------------------------------


def exposed_tools(
    servers: tuple[McpServerSpec, ...], listings: Mapping[str, list], taken: Mapping[str, str]
) -> list:
    """The (server, tool definition) pairs the model is offered, in declared order.

    ``taken`` maps names the agent already offers (registry tools,
    ``submit_output``) to what offers them.

    Raises:
        McpBuildError: a declared name the server does not list, a malformed
            listing, or two tools under one name.
    """
    owners = dict(taken)
    exposed = []
    for spec in servers:
        listed: dict[str, dict] = {}
        for entry in listings[spec.name]:
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not name:
                raise McpBuildError(f"MCP server {spec.name!r} lists a tool without a name")
            if name in listed:
                raise McpBuildError(f"MCP server {spec.name!r} lists the tool {name!r} twice")
            listed[name] = entry
        declared = [
            ("tools", spec.tools or ()),
            ("effects", spec.effects),
            ("results", spec.results),
        ]
        for table, names in declared:
            missing = next((n for n in names if n not in listed), None)
            if missing is not None:
                raise McpBuildError(
                    f"MCP server {spec.name!r} lists no tool {missing!r} (named in its `{table}`); "
                    f"it lists: {', '.join(listed) or 'nothing'}"
                )
        for name, entry in listed.items():
            if not spec.exposes(name):
                continue
            if not _MODEL_TOOL_NAME.fullmatch(name):
                raise McpBuildError(
                    f"the tool {name!r} of MCP server {spec.name!r} cannot be offered to a model "
                    "(a tool name is 1 to 64 letters, digits, `_` or `-`); leave "
                    "it out with the server's `tools`"
                )
            if name in owners:
                raise McpBuildError(
                    f"the tool {name!r} of MCP server {spec.name!r} has the same name as "
                    f"{owners[name]}; leave one out (a server's `tools` lists the ones it exposes)"
                )
            owners[name] = f"the tool of MCP server {spec.name!r}"
            exposed.append((spec, entry))
    return exposed


async def check_buildable(
    servers: tuple[McpServerSpec, ...],
    taken: Mapping[str, str],
    *,
    mark: Mapping[str, str],
    environ: Mapping[str, str] = os.environ,
) -> None:
    """Start every server, list its tools, check what the definition names, and close them all.

    Raises:
        McpBuildError: the server that will not build, and why; nothing is left running.
    """
    if not servers:
        return
    listings = {}
    async with open_connections(servers, mark=mark, environ=environ) as connections:
        for spec in servers:
            try:
                listings[spec.name] = await connections.list_tools(spec.name)
            except McpRemoteError as exc:
                # A JSON-RPC error's message is the remote's text: say what failed, quote nothing.
                failed = (
                    exc.message
                    if exc.error is None
                    else (
                        f"MCP server {spec.name!r} answered with a JSON-RPC error (code {exc.code})"
                    )
                )
                raise McpBuildError(
                    f"{failed}; the agent cannot be built without its tools"
                ) from None
            except McpError as exc:
                raise McpBuildError(
                    f"{exc.message}; the agent cannot be built without its tools"
                ) from None
    exposed_tools(servers, listings, taken)


# -- tools ---------------------------------------------------------------------------


def listing_tool(spec: McpServerSpec, connections: McpConnections) -> Tool:
    """The recorded call that lists a server's tools for a run.

    Error handling: a server that cannot list its tools leaves the call's
    intent open (``NotPerformed``): the listing is a read, so the next drive
    performs it again.
    """

    async def list_all(_arguments: Any, call: ToolCall) -> dict:
        try:
            return {"tools": await connections.list_tools(spec.name)}
        except McpError as exc:
            raise NotPerformed(
                f"{exc.message}, so its tools could not be listed; `salvor "
                f"resume {call.run_id}` tries again"
            ) from None

    return Tool(
        name=listing_tool_name(spec.name),
        description=f"List the tools of MCP server {spec.name}.",
        effect=Effect.READ,
        input_schema=_ARGUMENTS,
        handler=list_all,
    )


def mcp_tool(spec: McpServerSpec, entry: dict, connections: McpConnections) -> tuple[Tool, dict]:
    """One exposed MCP tool: the ``Tool`` the run context calls, and the spec the model is shown."""
    name = entry["name"]
    model_spec = {
        "name": name,
        "description": entry.get("description")
        if isinstance(entry.get("description"), str)
        else "",
        "input_schema": entry.get("inputSchema")
        if isinstance(entry.get("inputSchema"), dict)
        else dict(_ARGUMENTS),
    }
    if name in spec.results:
        return _answered_here(name, model_spec["description"], spec.results[name]), model_spec
    effect = spec.effect_of(name)
    return Tool(
        name=name,
        description=model_spec["description"],
        effect=effect,
        input_schema=_ARGUMENTS,
        handler=_forwarded(spec, name, effect, connections),
        idempotency_keys=spec.key_paths(name),
        mcp_server=spec.name,
        probe=spec.probe_of(name) if effect is Effect.WRITE else None,
    ), model_spec


def _answered_here(name: str, description: str, fixed: Any) -> Tool:
    """A tool whose every call the daemon answers with ``fixed`` (the server's ``results``)."""

    async def stubbed(_arguments: Any, _call: ToolCall) -> Any:
        return fixed  # answered here: the server never sees this call

    # The daemon's own constant answer changes nothing anywhere, so the
    # call is recorded as a read: re-answering it after a crash is safe.
    return Tool(
        name=name,
        description=description,
        effect=Effect.READ,
        input_schema=_ARGUMENTS,
        handler=stubbed,
    )


def _forwarded(spec: McpServerSpec, name: str, effect: Effect, connections: McpConnections):
    """The handler that sends a call of tool ``name`` to its server, each way it can fail said
    as the run context reads it (a write's lost answer is an unknown outcome)."""

    async def forward(arguments: Any, call: ToolCall) -> Any:
        meta = None
        if call.idempotency_key is not None:
            # A server may use the key to collapse a repeated execution.
            meta = {"salvor": {"idempotency_key": call.idempotency_key, "run_id": call.run_id}}
        try:
            result = await connections.call_tool(spec.name, name, arguments, meta)
        except McpRemoteError as exc:
            raise ToolFailed(exc.message, retryable=False) from None
        except McpNoAnswer as exc:
            if effect is Effect.WRITE:
                raise OutcomeUnknown(
                    f"{exc.message}; the write {name!r} may or may not have happened"
                ) from None
            raise ToolFailed(exc.message) from None
        except McpUnavailable as exc:
            raise ToolFailed(f"{exc.message}; the call was not performed") from None
        if not asks_to_park(result):
            return result
        # A request to park carries a schema to compile: off the loop, and shielded (the server
        # has answered; its answer must reach the log).
        return await off_loop(salvor_outcome, spec.name, name, result, shielded=True)

    return forward


def probe_reader(spec: McpServerSpec, name: str, connections: McpConnections) -> Tool:
    """The read tool ``name`` of ``spec``'s server as a probe: its answer is the result's data.

    The answer is the result's ``structuredContent``, else its one text block
    parsed as JSON. A result flagged ``isError``, or one with neither, is no
    answer (``ToolFailed``, not retried); a call the server never answered is
    retried as a read, each attempt bounded by the server's ``timeout``.
    """

    async def ask(arguments: Any, call: ToolCall) -> Any:
        try:
            result = await connections.call_tool(spec.name, name, arguments, None)
        except McpRemoteError as exc:
            raise ToolFailed(exc.message, retryable=False) from None
        except (McpNoAnswer, McpUnavailable) as exc:
            raise ToolFailed(exc.message) from None
        return probe_answer(spec.name, name, result)

    return Tool(
        name=name,
        description=f"The probe {name} of MCP server {spec.name}.",
        effect=Effect.READ,
        input_schema=_ARGUMENTS,
        handler=ask,
        mcp_server=spec.name,
    )


def probe_answer(server: str, tool: str, result: Any) -> Any:
    """A probe's answer from its MCP tool result (see ``probe_reader``).

    Raises:
        ToolFailed: not retryable; the result carries no answer, and says why.
    """
    what = f"the probe {tool!r} of MCP server {server!r}"
    if not isinstance(result, dict) or result.get("isError") is True:
        raise ToolFailed(f"{what} answered with an error result", retryable=False)
    if "structuredContent" in result:
        return result["structuredContent"]
    blocks = result.get("content")
    texts = [b for b in blocks if isinstance(b, dict)] if isinstance(blocks, list) else []
    if (
        len(texts) != 1
        or texts[0].get("type") != "text"
        or not isinstance(texts[0].get("text"), str)
    ):
        raise ToolFailed(
            f"{what} answered with neither structuredContent nor one text block",
            retryable=False,
        )
    try:
        return parse_strict(texts[0]["text"].encode(), what, big_integers=True)
    except MalformedJson:
        raise ToolFailed(f"{what} answered with text that is not JSON", retryable=False) from None


def asks_to_park(result: dict) -> bool:
    """Whether a tool result carries ``_meta.salvor`` (``salvor_outcome`` has work to do)."""
    meta = result.get("_meta")
    return isinstance(meta, dict) and "salvor" in meta


def salvor_outcome(server: str, tool: str, result: dict) -> Any:
    """The run's outcome of a tool result: ``Suspend``/``SleepUntil`` from
    ``_meta.salvor``, else the result.

    Raises:
        ToolFailed: never retryable, when ``_meta.salvor`` is malformed, names
            both keys or one salvor does not know, or sits on an ``isError`` result.
    """
    if not asks_to_park(result):
        return result
    request = result["_meta"]["salvor"]

    def refuse(problem: str) -> ToolFailed:
        return ToolFailed(
            f"MCP server {server!r} answered {tool!r} with a `_meta.salvor` request that "
            f"{problem}; the run was not parked and the call is not retried",
            retryable=False,
        )

    if result.get("isError") is True:
        raise refuse("sits on a result flagged isError (a failed call cannot park the run)")
    if not isinstance(request, dict):
        raise refuse("is not an object")
    unknown = sorted(set(request) - set(_SALVOR_KEYS))
    if unknown:
        raise refuse(
            f"uses the key {unknown[0]!r}, which salvor does not know (it "
            "knows suspend and sleep_until)"
        )
    if len(request) != 1:
        raise refuse(
            "names both suspend and sleep_until"
            if request
            else "names neither suspend nor sleep_until"
        )
    if "sleep_until" in request:
        try:
            return SleepUntil(wake_at=parse_instant(request["sleep_until"]))
        except ValueError as exc:
            raise refuse(f"has a sleep_until that is not an RFC 3339 instant ({exc})") from None
    suspend = request["suspend"]
    if not isinstance(suspend, dict):
        raise refuse("has a suspend that is not an object")
    extra = sorted(set(suspend) - _SUSPEND_KEYS)
    if extra:
        raise refuse(f"has the unknown suspend field {extra[0]!r}")
    reason, schema, kind = suspend.get("reason"), suspend.get("input_schema"), suspend.get("kind")
    if not isinstance(reason, str) or not reason.strip():
        raise refuse("has a suspend without a `reason` string")
    if "input_schema" not in suspend:
        raise refuse("has a suspend without an `input_schema`")
    try:
        check_schema(schema)
    except MalformedEvent as exc:
        raise refuse(f"has a suspend whose input_schema is unusable: {exc.message}") from None
    if "kind" in suspend and kind != "signal":
        raise refuse('has a suspend `kind` other than "signal"')
    return Suspend(reason=reason, input_schema=schema, kind=kind)


def mcp_result_for_model(value: Any) -> tuple[str, bool]:
    """What the model reads of an MCP tool's recorded output: its text,
    and whether it is an error."""
    if not (isinstance(value, dict) and isinstance(value.get("content"), list)):
        return (
            value
            if isinstance(value, str)
            else json.dumps(value, ensure_ascii=False, sort_keys=True)
        ), False
    parts = []
    for block in value["content"]:
        if (
            isinstance(block, dict)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        ):
            parts.append(block["text"])
        elif isinstance(block, dict):
            # Binary payloads (images, audio, blobs) are named, not pasted into the conversation.
            shown = {k: v for k, v in block.items() if k not in ("data", "blob")}
            parts.append(json.dumps(shown, ensure_ascii=False, sort_keys=True))
    if not parts and "structuredContent" in value:
        parts.append(json.dumps(value["structuredContent"], ensure_ascii=False, sort_keys=True))
    return "\n".join(parts), value.get("isError") is True
