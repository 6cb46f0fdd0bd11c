"""The tool registry: named tools with declared effects, and what a tool may return.

A tool's effect decides what happens when its call is found open after a
crash: ``read`` and ``idempotent`` calls are executed again (an idempotent
one under its recorded key), a ``write`` parks the run for a person.

A ``write`` or ``idempotent`` tool may name key fields (``idempotency_keys``,
dotted paths into its input): the call's identity across runs is then those
fields and the tool (``call_identity``), and the store lets one run perform it.

A ``write`` may declare a ``Probe``: a read that tells whether the write
landed, which recovery runs before it parks the run for a person.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

import trio
from salvor.protocol import Effect, sha256_hash
from salvor.store import store_fault

from ..skills import SkillLibrary
from ._file_inputs import check_file_inputs
from ._workspace import Workspace

# Keys of the identity document besides the key fields: a key path may not be one.
_IDENTITY_NAMES = frozenset({"tool", "mcp_server"})


def check_key_paths(where: str, value: Any) -> tuple[str, ...]:
    """Validate declared key fields: dotted input paths such as ``"order.id"``.

    Raises:
        ValueError: one sentence naming ``where`` and the bad path.
    """
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"{where} must be a dotted input path or a non-empty array of them")
    for path in value:
        if not isinstance(path, str) or not all(path.split(".")):
            raise ValueError(
                f"{where} holds {path!r}, which is not a dotted input path (like `order.id`)"
            )
        if path in _IDENTITY_NAMES:
            raise ValueError(
                f"{where} names {path!r}, which the call's identity uses for itself; "
                "a key path cannot be `tool` or `mcp_server`"
            )
    if len(set(value)) != len(value):
        raise ValueError(f"{where} names one path twice")
    return tuple(value)


class MissingKeyField(Exception):
    """A call's input lacks a field its tool's identity is made of; nothing was claimed."""

    def __init__(self, tool: str, path: str) -> None:
        super().__init__(
            f"the input of tool {tool} has no `{path}`, a field its idempotency key is made of"
        )
        self.message = str(self)
        self.path = path


def check_path(where: str, value: Any) -> str:
    """Validate one dotted path such as ``"refund.id"``.

    Raises:
        ValueError: one sentence naming ``where``.
    """
    if not isinstance(value, str) or not all(value.split(".")):
        raise ValueError(f"{where} must be a dotted path (like `refund.id`), not {value!r}")
    return value


def _field(tool_input: Any, path: str) -> Any:
    value = tool_input
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def call_identity(
    tool: str, key_paths: Sequence[str], tool_input: Any, *, mcp_server: str | None = None
) -> str:
    """The identity a call of ``tool`` with ``tool_input`` claims, shared by every run.

    ``sha256`` (as ``sha256:<hex>``) over the RFC 8785 canonical JSON of
    ``{"tool": <name>, "<path>": <value>, ...}`` with one member per key
    path (named by the dotted path as declared, its value taken from the
    input), plus ``"mcp_server": <server name>`` for an MCP tool. No run id
    and no seq: the same refund asked for by two runs is one identity, and
    a built-in agent's MCP call and a process agent's call of the same
    server's tool through a stand-in are one identity too.

    Raises:
        MissingKeyField: the input lacks one of the paths.
    """
    document: dict[str, Any] = {"tool": tool}
    if mcp_server is not None:
        document["mcp_server"] = mcp_server
    for path in key_paths:
        try:
            document[path] = _field(tool_input, path)
        except KeyError:
            raise MissingKeyField(tool, path) from None
    return sha256_hash(document)


def derived_key(run_id: str, seq: int, tool: str) -> str:
    """The key of an ``idempotent`` call with no key fields: its position, as the spec derives it.

    ``sha256`` over the canonical JSON of ``{"run": run_id, "seq": seq, "tool": tool}``:
    every retry of the same position presents the same key; two positions are two calls.
    """
    return sha256_hash({"run": run_id, "seq": seq, "tool": tool})


def graph_call_key(lineage: str, graph_hash: str, node: str, index: int, tool: str) -> str:
    """The key of an ``idempotent`` graph tool call with no key fields: its place in the graph.

    ``sha256`` over the canonical JSON of ``{"lineage": lineage, "graph": graph_hash, "node":
    node, "call": index, "tool": tool}`` (``index``: 0 for a tool node, the item's index in a
    map's tool body, the call's index among an agent node's tool calls; ``lineage``: the run
    its forks descend from, ``lineage_root``). No seq, so a fork re-walking the call presents
    its origin's key and a provider that collapses repeated keys performs it once; the lineage,
    so two unrelated runs of one graph (another author, another input) are two calls.
    """
    return sha256_hash(
        {"lineage": lineage, "graph": graph_hash, "node": node, "call": index, "tool": tool}
    )


class ProbeVerdict(enum.StrEnum):
    """What a probe's answer says of its write."""

    LANDED = "landed"
    NOT_LANDED = "not_landed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """A read that tells whether a write landed, and which part of its answer is the write's output.

    ``tool``: the read's name (a registered tool for a native write, a tool
    of the same server for an MCP one). ``input``: probe input field -> a
    dotted path into the write's recorded input. ``landed``: a dotted path
    into the answer, ``true`` when the write landed, ``false`` when it did
    not; anything else cannot tell. ``output``: a dotted path into the answer
    that becomes the write's recorded output (None: the whole answer).
    """

    tool: str
    input: Mapping[str, str]
    landed: str
    output: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tool, str) or not self.tool:
            raise ValueError("a probe's `tool` must name a read tool")
        if not isinstance(self.input, Mapping) or not all(
            isinstance(name, str) and name for name in self.input
        ):
            raise ValueError(
                "a probe's `input` must be a table of probe input field -> a dotted path "
                "into the write's input"
            )
        for name, path in self.input.items():
            check_path(f"the probe's `input` entry {name!r}", path)
        check_path("a probe's `landed`", self.landed)
        if self.output is not None:
            check_path("a probe's `output`", self.output)
        object.__setattr__(self, "input", MappingProxyType(dict(self.input)))

    def probe_input(self, write_input: Any) -> dict:
        """The probe's input, taken from the write's recorded input.

        Raises:
            KeyError: the write's input lacks a path (named in the message).
        """
        return {name: _field(write_input, path) for name, path in self.input.items()}

    def verdict(self, answer: Any) -> tuple[ProbeVerdict, Any]:
        """What ``answer`` says, and (when landed) the write's output drawn from it.

        A landed answer without its ``output`` path cannot tell either: the
        write's outcome would be recorded without its output.
        """
        try:
            landed = _field(answer, self.landed)
        except KeyError:
            return ProbeVerdict.UNKNOWN, None
        if landed is False:
            return ProbeVerdict.NOT_LANDED, None
        if landed is not True:
            return ProbeVerdict.UNKNOWN, None
        if self.output is None:
            return ProbeVerdict.LANDED, answer
        try:
            return ProbeVerdict.LANDED, _field(answer, self.output)
        except KeyError:
            return ProbeVerdict.UNKNOWN, None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """What a tool handler is told about the call it is executing."""

    run_id: str
    seq: int
    # The same on every attempt and every retry of the call: its identity when
    # the tool names key fields, else (an idempotent call) its position's
    # derived key; None for a read or an unkeyed write. Hand it to a provider
    # that honours idempotency keys and it collapses a retry by itself.
    idempotency_key: str | None
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspend:
    """Outcome: park the run until something resumes it with an input ``input_schema`` accepts."""

    reason: str
    input_schema: dict
    kind: str | None = None  # "signal" when an external system, not a person, owes the input


@dataclass(frozen=True, slots=True, kw_only=True)
class SleepUntil:
    """Outcome: park the run on a durable timer until ``wake_at``."""

    wake_at: datetime


class ToolFailed(Exception):
    """A tool refused or failed; ``retryable`` says whether trying again could help."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class OutcomeUnknown(Exception):
    """A write was sent and no answer came back: it may or may not have happened.

    The runtime never guesses: the call's intent stays open, which parks the
    run in needs_reconciliation until a person records what happened. (A read
    or an idempotent call raising it is retried like a ``ToolFailed``.)
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotPerformed(Exception):
    """The handler could not perform the call now, and nothing of it happened.

    The runtime leaves the call's intent open and ends the drive; the next
    drive performs it again. Only for calls without an effect to fear (a
    read): an open write intent is needs_reconciliation whatever the reason.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


Handler = Callable[[Any, ToolCall], Awaitable[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    name: str
    description: str
    effect: Effect
    input_schema: dict
    handler: Handler
    # Dotted input paths the call's identity is made of (``check_key_paths``);
    # empty: no identity across runs. Ignored on a ``read``, which never claims.
    idempotency_keys: tuple[str, ...] = ()
    # The MCP server that performs the call (None for a native tool): part of the
    # identity, so two servers' same-named tools never share one.
    mcp_server: str | None = None
    # The read that tells whether a call landed (a ``write`` only).
    probe: Probe | None = None
    # Arguments whose value is a path the tool reads (``check_file_inputs``): in a flow, a file
    # of the client's, handed to the tool as a temporary file of the daemon's.
    file_inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.idempotency_keys:
            check_key_paths(f"the `idempotency_keys` of tool {self.name!r}", self.idempotency_keys)
        if self.file_inputs:
            check_file_inputs(
                f"the `file_inputs` of tool {self.name!r}", self.file_inputs, self.input_schema
            )
        if self.probe is not None and self.effect is not Effect.WRITE:
            raise ValueError(
                f"tool {self.name!r} is {self.effect.value}, and only a write has a probe: "
                "an open read or idempotent call is simply performed again"
            )

    @property
    def claims(self) -> bool:
        """Whether a call of this tool claims an identity across runs."""
        return self.effect is not Effect.READ and bool(self.idempotency_keys)

    def call_identity(self, tool_input: Any) -> str:
        """The identity a call with ``tool_input`` claims (``call_identity`` of this tool).

        Raises:
            MissingKeyField: the input lacks one of the paths.
        """
        return call_identity(
            self.name, self.idempotency_keys, tool_input, mcp_server=self.mcp_server
        )

    def spec(self) -> dict:
        """The tool as the model sees it."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


# Attempts per effect class: a read or an idempotent call can be retried
# safely; a write is tried once, since a failure may hide a landed effect.
ATTEMPTS = {Effect.READ: 3, Effect.IDEMPOTENT: 3, Effect.WRITE: 1}


class ToolRegistry:
    """The named tools a daemon can execute.

    ``wired`` is False only for ``unwired()``: a host that gives the daemon no
    registry at all, which is not the same as an empty one (``salvor serve``'s):
    a tool asked of an empty registry is unknown, of an unwired one unavailable.

    ``workspace``: the operator's folder for the file tools (None: no file tool is offered).
    Those tools are built per agent (its ``access`` confines them), so ``get`` never answers
    one; ``names`` lists them, as names a definition may grant. ``skills``: where the skills a
    definition declares are found (salvor's own only, unless the host gives the operator's).
    """

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self.wired = True
        self.workspace: Workspace | None = None
        # Where the skills agents declare are found (the operator's folders, then salvor's).
        self.skills = SkillLibrary()
        self._tools: dict[str, Tool] = {}
        for tool in tools or ():
            self._add(tool)
        for tool in self._tools.values():
            self._check_probe(tool)

    def _add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def _check_probe(self, tool: Tool) -> None:
        if tool.probe is None:
            return
        reader = self._tools.get(tool.probe.tool)
        if reader is None or reader.effect is not Effect.READ:
            raise ValueError(
                f"the probe of tool {tool.name!r} names {tool.probe.tool!r}, which is not a "
                "registered read tool"
            )

    @classmethod
    def unwired(cls) -> ToolRegistry:
        """The stand-in for no registry: it holds no tools and takes none."""
        registry = cls()
        registry.wired = False
        return registry

    def register(self, tool: Tool) -> None:
        """Add ``tool``; its probe's read must be registered already.

        Raises:
            ValueError: the name is taken, the probe names no registered read, or this is
                ``unwired()``'s (a registry that is not there takes no tools).
        """
        if not self.wired:
            raise ValueError(f"tool {tool.name!r} cannot be registered: no registry is wired")
        self._check_probe(tool)
        self._add(tool)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def probe_of(self, tool: Tool) -> Tool | None:
        """The read that probes ``tool`` (None when it declares no probe)."""
        return None if tool.probe is None else self._tools.get(tool.probe.tool)

    def names(self) -> list[str]:
        """The tools a definition may name: the registry's, and the workspace's file tools."""
        files = self.workspace.tool_names if self.workspace is not None else ()
        return sorted({*self._tools, *files})

    def file_inputs(self) -> dict[str, tuple[str, ...]]:
        """Each tool that declares file inputs, by name, with its arguments."""
        return {name: tool.file_inputs for name, tool in self._tools.items() if tool.file_inputs}

    def listing(self) -> list[dict]:
        """The tools as ``GET /v1/tools`` lists them, by name."""
        return [
            {
                "name": name,
                "effect": tool.effect.value,
                "file_inputs": [
                    {"target": argument, "path": "${" + argument + "}"}
                    for argument in tool.file_inputs
                ],
            }
            for name, tool in sorted(self._tools.items())
        ]


class DispatchFailed(Exception):
    """Every attempt a tool's effect allows failed; ``message`` is the last failure."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts


async def dispatch(
    tool: Tool, tool_input: Any, *, run_id: str, seq: int, key: str | None
) -> tuple[Any, int]:
    """Run a tool's handler, retried as its effect allows; the outcome and the attempt that gave it.

    A read or idempotent tool is tried up to three times (an idempotent one
    under the same key every time); a write once, since its failure may
    hide a landed effect.

    Raises:
        DispatchFailed: the last attempt failed (or a failure said retrying cannot help).
        OutcomeUnknown: a write's handler sent it and got no answer.
        NotPerformed: the handler could not perform the call now.
        StoreUnavailable: the daemon's store failed under the handler (``store_fault``: a
            subagent's child could not record); not retried, and nothing of it is the tool's.
    """
    attempts = ATTEMPTS[tool.effect]
    for attempt in range(1, attempts + 1):
        try:
            outcome = await tool.handler(
                tool_input, ToolCall(run_id=run_id, seq=seq, idempotency_key=key, attempt=attempt)
            )
        except NotPerformed:
            raise
        except OutcomeUnknown as exc:
            if tool.effect is Effect.WRITE:
                raise  # the caller leaves the intent open: never guessed, never retried
            if attempt == attempts:
                raise DispatchFailed(exc.message, attempt) from None
        except ToolFailed as exc:
            if not exc.retryable or attempt == attempts:
                raise DispatchFailed(exc.message, attempt) from None
        except Exception as exc:  # a tool's own bug is its failure, never a crash of the caller
            if store_fault(exc):
                # The daemon's own store failed under a tool it hosts (a subagent's child run):
                # that is no failure of the tool's to record, and no retry can help before the
                # store heals; the drive stops with the call's intent open, and is healed.
                raise
            if attempt == attempts:
                raise DispatchFailed(f"{type(exc).__name__}: {exc}", attempt) from None
        else:
            return outcome, attempt
        await trio.sleep(min(0.05 * 2**attempt, 1.0))
    raise AssertionError("unreachable: the last attempt always returns or raises")
