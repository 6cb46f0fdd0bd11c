"""A pinned agent node: a flow's regression test, its calls held against a recorded baseline.

The baseline is the node's calls in order (``__baselines__/<flow stem>/<node id>.calls.json``
beside the flow's real file): each model call's request and its answer, each tool call's name,
input and answer. A run that updates its baselines drives the node live, its model calls recorded
with their requests, and the calls are read back out of its log once it completes
(``node_calls``). A run that compares answers every call from the baseline by position: nothing
goes to a provider and no tool is performed, and a call that is not the baseline's (another
request, another tool or input, a call past the baseline's end, a baseline call never made)
fails the run naming the call and the first difference.

An answered call is recorded in the run's own log, intent and completion together, the
completion naming the baseline it came from; a later drive (a recovery, a fork's continuation)
answers it from that log like any completed call, so it never needs the provider either.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from salvor.protocol import (
    Effect,
    Envelope,
    GraphNode,
    MalformedEvent,
    ModelCallCompleted,
    ModelCallRequested,
    NodeEntered,
    NodeExited,
    ToolCallCompleted,
    ToolCallRequested,
    sha256_hash,
)

from ..recording import RunContext
from ._pinned_baseline import baseline_calls, calls_baseline_path
from ._snapshot import first_difference, read_baseline
from ._walk_parts import WalkParts

# How many answered calls' events are held before they are committed together.
HELD_PER_COMMIT = 128

if TYPE_CHECKING:
    from ..models import ModelGateway
    from ..tools import Tool


def node_calls(log: Sequence[Envelope], node_id: str) -> list[dict]:
    """The calls agent node ``node_id`` made, as the log between its entry and its exit records
    them (the baseline's ``calls``): ``{"kind": "model", "request", "request_hash", "response",
    "usage"}`` and ``{"kind": "tool", "tool", "input", "effect", "output"}``."""
    calls: list[dict] = []
    by_seq: dict[int, dict] = {}
    inside = False
    for envelope in log:
        event = envelope.event
        if isinstance(event, NodeEntered | NodeExited) and event.node == node_id:
            if inside:
                break
            inside = isinstance(event, NodeEntered)
        elif not inside:
            continue
        elif isinstance(event, ModelCallRequested):
            by_seq[envelope.seq] = {
                "kind": "model",
                "request": event.request_body,
                "request_hash": event.request_hash,
            }
            calls.append(by_seq[envelope.seq])
        elif isinstance(event, ToolCallRequested):
            by_seq[envelope.seq] = {
                "kind": "tool",
                "tool": event.tool,
                "input": event.input,
                "effect": event.effect,
            }
            calls.append(by_seq[envelope.seq])
        elif isinstance(event, ModelCallCompleted) and event.seq in by_seq:
            by_seq[event.seq].update(response=event.response, usage=event.usage)
        elif isinstance(event, ToolCallCompleted) and event.seq in by_seq:
            by_seq[event.seq]["output"] = event.output
    return calls


def _described(call: dict) -> str:
    if call.get("kind") == "tool":
        return f"tool call {call.get('tool')!r}"
    request = call.get("request")
    model = request.get("model") if isinstance(request, dict) else None
    return f"a call of model {model!r}" if model is not None else "a model call"


class PinnedCalls:
    """The run context a pinned agent node's conversation goes through (the walk's ``ctx``
    for everything but its model and tool calls).

    ``baseline``: the recorded calls when comparing; None when the run updates its baselines
    (the node is then driven live, its requests recorded for the baseline). ``fail``: fails the
    run naming the node (raises ``Parked``).
    """

    def __init__(
        self,
        ctx: RunContext,
        path: str,
        baseline: list[dict] | None,
        fail: Callable[[str], Awaitable[None]],
    ) -> None:
        self._ctx = ctx
        self.path = path
        self.baseline = baseline
        self._fail = fail
        # The node's calls made so far, answered from its log or its baseline.
        self.position = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    async def model_call(
        self, gateway: ModelGateway, request: dict, *, record_prompts: bool
    ) -> tuple[dict, dict]:
        """The model call: live when updating (its request recorded whatever the agent says, so
        the baseline holds it), else its log's answer or its baseline's (``Parked`` when it is
        not the baseline's call)."""
        ctx = self._ctx
        if self.baseline is None:
            return await ctx.model_call(gateway, request, record_prompts=True)
        request_hash = sha256_hash(request)
        recorded = ctx.cursor.model_call(request_hash)
        if recorded is not None and recorded.completed:
            self.position += 1
            event = recorded.completion.event
            return event.response, event.usage
        expected = await self._expected(f"asks for model {request.get('model')!r}")
        if expected.get("kind") != "model":
            await self._differs(
                f"the agent now asks for a model call, the baseline has {_described(expected)}"
            )
        if isinstance(expected.get("request"), dict):
            difference = first_difference(expected["request"], request)
        elif expected.get("request_hash") != request_hash:
            difference = (
                f"the request hash {request_hash} is not the recorded "
                f"{expected.get('request_hash')}"
            )
        else:
            difference = None
        if difference is not None:
            await self._differs(f"the model request {difference}")
        try:
            answer = ModelCallCompleted(
                seq=recorded.seq if recorded is not None else self._next_seq(),
                response=expected.get("response"),
                usage=expected.get("usage"),
                baseline=self.path,
            )
        except MalformedEvent as exc:
            await self._differs(f"the baseline's answer is not a model call's: {exc.message}")
        intent = ModelCallRequested(request_hash=request_hash, request_body=request)
        await self._hold(*([answer] if recorded is not None else [intent, answer]))
        return answer.response, answer.usage

    async def tool_call(
        self, tool: Tool, tool_input: Any, *, probe: Tool | None = None, key: str | None = None
    ) -> Any:
        """The tool call: live when updating, else its log's answer or its baseline's, never
        performed (``Parked`` when it is not the baseline's call)."""
        ctx = self._ctx
        if self.baseline is None:
            return await ctx.tool_call(tool, tool_input, probe=probe, key=key)
        recorded = ctx.cursor.tool_call(tool.name, tool_input)
        if recorded is not None and recorded.completed:
            self.position += 1
            return await ctx.after_tool(recorded.completion.event.output)
        expected = await self._expected(f"calls the tool {tool.name!r}")
        if expected.get("kind") != "tool" or expected.get("tool") != tool.name:
            await self._differs(
                f"the agent now calls the tool {tool.name!r}, the baseline has "
                f"{_described(expected)}"
            )
        difference = first_difference(expected.get("input"), tool_input)
        if difference is not None:
            await self._differs(f"the {tool.name} input {difference}")
        seq = recorded.seq if recorded is not None else self._next_seq()
        answer = ToolCallCompleted(seq=seq, output=expected.get("output"), baseline=self.path)
        # No key and no claim: nothing is performed, so no identity is taken from a real call.
        intent = ToolCallRequested(
            tool=tool.name, input=tool_input, effect=Effect(tool.effect).value, idempotency_key=None
        )
        await self._hold(*([answer] if recorded is not None else [intent, answer]))
        return await ctx.after_tool(answer.output)

    async def ended(self) -> None:
        """The conversation ended: fails the run when a call of the baseline was never made."""
        if self.baseline is None or self.position >= len(self.baseline):
            return
        missed = self.baseline[self.position]
        await self._fail(
            f"the agent ended after {self.position} of the {len(self.baseline)} calls its "
            f"baseline {self.path} records; call {self.position + 1} ({_described(missed)}) "
            "was never made"
        )

    async def _hold(self, *events: Any) -> None:
        """Keep an answered call for the next append: nothing went out, so it need not be
        durable before the agent reads its answer (a crash only means the next drive answers it
        from the baseline again); committed a batch at a time."""
        self._ctx.hold(*events)
        self.position += 1
        if self._ctx.held >= HELD_PER_COMMIT:
            await self._ctx.flush()

    def _next_seq(self) -> int:
        return self._ctx.view.next_seq + self._ctx.held

    async def _expected(self, live: str) -> dict:
        """The baseline's call at this position (``Parked`` when it has none)."""
        if self.position >= len(self.baseline):
            await self._fail(
                f"call {self.position + 1} has no counterpart: the baseline {self.path} records "
                f"only {len(self.baseline)} calls, and the agent now {live}"
            )
        return self.baseline[self.position]

    async def _differs(self, problem: str) -> None:
        await self._fail(
            f"call {self.position + 1} differs from its baseline {self.path}: {problem}"
        )


async def pinned_calls(walk: WalkParts, ctx: RunContext, node: GraphNode) -> PinnedCalls:
    """The context the pinned agent ``node`` converses through; ``Parked`` (the run failed
    naming the node) in a run without files, or when comparing without a usable baseline."""

    async def fail(message: str) -> None:
        await walk.fail(ctx, node, message)

    files = walk.files
    if files is None:
        await fail("a pinned agent runs only in a run of a flow file, which brings its baseline")
    path = calls_baseline_path(files.bundle, node.id)
    if files.bundle.update_baselines:
        return PinnedCalls(ctx, path, None, fail)
    document, problem = read_baseline(files, path, f"pinned agent {node.id!r}")
    if problem is not None:
        await fail(problem)
    calls, problem = baseline_calls(document)
    if problem is not None:
        await fail(f"pinned agent {node.id!r}: the baseline {path} is not its calls: {problem}")
    return PinnedCalls(ctx, path, calls, fail)


def calls_document(node_id: str, calls: list[dict]) -> dict:
    """A pinned node's baseline: its id and its calls in order."""
    return {"node": node_id, "calls": calls}
