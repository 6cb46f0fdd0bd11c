"""``POST /v1/graph-runs`` answered as a stream (``Accept: application/x-ndjson``): one JSON object
a line, from the run's committed events, until the run rests.

Lines, in order: ``{"type": "started", "run"}``; ``{"type": "node", "run", "node", "status"}`` for
each node the run (or a nested flow's child run, under its own id) enters, finishes or skips;
``{"type": "keepalive"}`` after the daemon's heartbeat (``salvor serve --stream-keepalive``,
15 s) of silence, well under a proxy's read timeout (nginx's is 60 s); last, once the run rests
(terminal, or parked: it no longer moves by itself), ``{"type": "result", "run", "status",
"detail", "output", "error"?, "baseline_writes", "client_files"}`` (``client_files``: what a
linked run's authoring tools saved for the client). The stream is only a reader: a client that
goes away leaves the run going, and a daemon that stops ends the stream without a result line.
Events come from the hub and the store as an SSE stream's do (``tail_run``), never from a poll of
its own.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from quart import Response, request
from quart.wrappers.response import IterableBody
from quart_trio import QuartTrio
from salvor.protocol import GraphRunStarted, NodeEntered, NodeExited, NodeKind, NodeSkipped

from ..flows import LINKED_LABEL
from ..graphs import (
    baseline_directives,
    captured_baselines,
    client_file_directives,
    flow_child_id,
    saved_client_files,
)
from ._run_tail import Beat, TailEnd, envelope_of, tail_run
from ._state import ServerState
from ._stream_slots import StreamSlot

NDJSON = "application/x-ndjson"
HEADERS = {
    "Content-Type": NDJSON,
    # Progress lines are for this caller, now: no cache keeps them, no proxy rewrites them.
    "Cache-Control": "no-cache, no-transform",
    # nginx buffers proxied responses unless told not to.
    "X-Accel-Buffering": "no",
}
_RUN = {"type": "string", "format": "uuid"}


def _line_schema(kind: str, required: tuple[str, ...], **properties: Any) -> dict:
    return {
        "type": "object",
        "required": ["type", *required],
        "properties": {"type": {"const": kind}, **properties},
    }


# A list of files for the client to write, each its path and its bytes.
_DIRECTIVES = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["path", "content", "encoding"],
        "properties": {
            "path": {"type": "string"},
            "content": {"type": "string", "contentEncoding": "base64"},
            "encoding": {"const": "base64"},
        },
    },
}
# The OpenAPI answer: each line one of these objects.
STREAM_ANSWER = {
    "description": "The run's progress, one JSON object a line, until its `result`.",
    "content": {
        NDJSON: {
            "schema": {
                "oneOf": [
                    _line_schema("started", ("run",), run=_RUN),
                    _line_schema(
                        "node",
                        ("run", "node", "status"),
                        run=_RUN,
                        node={"type": "string"},
                        status={"enum": ["entered", "finished", "skipped"]},
                    ),
                    _line_schema("keepalive", ()),
                    _line_schema(
                        "result",
                        ("run", "status", "detail", "output", "baseline_writes", "client_files"),
                        run=_RUN,
                        status={"type": "string", "description": "The run's state."},
                        detail={"type": "object", "description": "The run's status object."},
                        output={"description": "The run's output; null unless completed."},
                        error={"type": "string", "description": "Why it failed."},
                        baseline_writes=_DIRECTIVES,
                        client_files={
                            **_DIRECTIVES,
                            "description": "The files the run's authoring tools saved for the "
                            "client in a run sent with `X-Salvor-Linked` (its agents under "
                            "`<project>/.salvor/agents/`, its flows under "
                            "`<project>/.salvor/flows/`), the last bytes per path.",
                        },
                    ),
                ]
            }
        }
    },
}
_STATUS = {NodeEntered: "entered", NodeExited: "finished", NodeSkipped: "skipped"}


def wants_stream() -> bool:
    """Whether the caller asked for the ndjson stream by name (``*/*`` is not asking)."""
    return any(value == NDJSON and quality > 0 for value, quality in request.accept_mimetypes)


def line(**fields: Any) -> bytes:
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def stream_response(
    app: QuartTrio, state: ServerState, run_id: str, slot: StreamSlot, *, flow_run: bool
) -> Response:
    """The 200 ndjson answer for the started run ``run_id``; ``slot`` is let go when it ends.
    ``flow_run``: a run of a flow sent with the call, whose result hands back the baselines
    its runs captured (a nested run may update its baselines while the call compares)."""
    body = _LinesBody(_lines(state, run_id, flow_run), slot)
    response = app.response_class(body, status=200, headers=HEADERS)
    response.timeout = None
    return response


class _LinesBody(IterableBody):
    """The lines as a response body; the stream's slot let go when the body is closed, whether
    or not it was ever iterated."""

    def __init__(self, lines: AsyncGenerator[bytes], slot: StreamSlot) -> None:
        super().__init__(lines)
        self._slot = slot

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await super().__aexit__(*exc_info)
        finally:
            self._slot.release()


async def _lines(state: ServerState, run_id: str, flow_run: bool) -> AsyncIterator[bytes]:
    yield line(type="started", run=run_id)
    end = None
    async with aclosing(_run_lines(state, run_id, run_id)) as lines:
        async for item in lines:
            if isinstance(item, TailEnd):
                end = item
                break
            yield item
    if end is None or end.stopping:
        return  # the daemon stops: the run is not at rest, and says nothing it is not
    yield await _result(state, run_id, end, flow_run)


async def _result(state: ServerState, run_id: str, end: TailEnd, flow_run: bool) -> bytes:
    runtime = state.runtime
    status = end.view.status_at(runtime.kit.clock())
    writes = {}
    if flow_run:
        writes = await captured_baselines(
            runtime.reads,
            runtime.definitions.load_graph,
            run_id,
            runtime.definitions.load_flow_bundle,
        )
    extra = {"error": status["error"]} if "error" in status else {}
    # Read from the logs, as a restarted daemon would: a file saved is in the call's answer.
    # Only a linked tree saves files for its client; another has none to look for.
    saved = {}
    if LINKED_LABEL in (end.view.labels or {}):
        saved = await saved_client_files(runtime.reads, run_id)
    return line(
        type="result",
        run=run_id,
        status=status["state"],
        detail=status,
        output=status.get("output"),
        **extra,
        baseline_writes=baseline_directives(writes),
        client_files=client_file_directives(saved),
    )


async def _run_lines(
    state: ServerState, run_id: str, driven_as: str
) -> AsyncIterator[bytes | TailEnd]:
    """The node and keepalive lines of ``run_id`` and, each where its flow node enters, of its
    nested flows' child runs; last the run's ``TailEnd`` (a child's ``stopping`` one ends it)."""
    runtime = state.runtime
    # Subscribed before the store is read, so no commit falls in between.
    subscription = state.hub.subscribe(run_id, state.stream_buffer_bytes)
    try:
        page = await runtime.reads.read_page(run_id, 0)
    except BaseException:
        subscription.close()
        raise
    flows: frozenset[str] = frozenset()
    tail = tail_run(
        state, run_id, subscription, page, beat_seconds=state.heartbeat_seconds, driven_as=driven_as
    )
    del page
    async with aclosing(tail):
        async for item in tail:
            if isinstance(item, TailEnd):
                yield item
                return
            if isinstance(item, Beat):
                yield line(type="keepalive")
                continue
            out = []
            for entry in item:
                event = envelope_of(entry).event
                if isinstance(event, GraphRunStarted):
                    flows = await _flow_nodes(state, event.graph_hash)
                status = _STATUS.get(type(event))
                if status is None:
                    continue
                out.append(line(type="node", run=run_id, node=event.node, status=status))
                if status != "entered" or event.node not in flows:
                    continue
                # The child runs while this run waits on it: its lines come next, whole.
                yield b"".join(out)
                out = []
                child = flow_child_id(run_id, event.node)
                async with aclosing(_run_lines(state, child, driven_as)) as nested:
                    async for got in nested:
                        if isinstance(got, TailEnd):
                            if got.stopping:
                                yield got
                                return
                            break
                        yield got
            if out:
                yield b"".join(out)


async def _flow_nodes(state: ServerState, graph_hash: str) -> frozenset[str]:
    """The ids of the graph's ``flow`` nodes (each runs a child whose lines the stream carries)."""
    graph = await state.runtime.definitions.load_graph(graph_hash)
    return frozenset(node.id for node in graph.nodes if node.kind is NodeKind.FLOW)
