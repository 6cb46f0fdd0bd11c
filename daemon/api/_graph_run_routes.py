"""``POST /v1/graph-runs``: start a run of a stored graph (by its hash, or by the name a flow is
kept as: ``_named_flow_runs``), or of a flow file sent over a link.

The graph is loaded by its hash and every agent and tool its nodes name is resolved before
anything is written; the head (``GraphRunStarted``) is durable before the answer, and the walk
is handed to the driving set, as ``POST /v1/runs`` hands an agent run. From there a graph run is
an ordinary run: its status, stream, resume (a gate's approval checked against its schema),
abandon and recovery are the run routes'.

A flow sent with the call (``flow`` and its ``members``) is checked bytes first (every member,
then the document: a 422 refuses the call whole), marked linked, pre-checked as a whole (a 400
``invalid_graph`` naming each offending node; a process agent is refused, its command would run
on this machine) and kept content-addressed with the run: the walk, recovery and forks read
those files only, never a path of the client's. A member (or the flow file) may name an upload
(``POST /v1/uploads``) instead of carrying its bytes: every upload the call names is taken from
the store (deleted) before any member is read, so it is spent whether the call starts a run or
is refused. With ``X-Salvor-Linked: 1`` the run tree is marked linked (``_linked_runs``).
"""

from __future__ import annotations

import json

from quart import request
from quart_trio import QuartTrio
from salvor.protocol import (
    BadFlowBytes,
    ErrorCode,
    MalformedBundle,
    MalformedJson,
    check_document,
    flow_from_call,
    named_uploads,
)

from ..graphs import FlowFiles, flow_without_members
from ..runs import Uploads
from ..web import OperationRefused, bad_request
from ._answers import RUN_STARTED
from ._graph_run_body import START_GRAPH_RUN
from ._graph_run_stream import STREAM_ANSWER, stream_response, wants_stream
from ._http import body_bytes
from ._linked_runs import linked_labels
from ._named_flow_runs import start_named_flow
from ._operation import Operation, error, route
from ._state import ServerState
from ._stream_slots import TOO_MANY_STREAMS, StreamSlot

START = Operation(
    method="post",
    rule="/v1/graph-runs",
    operation_id="startGraphRun",
    new_work=True,
    tag="graphs",
    summary=(
        "Start a run of a stored graph; answered once its head event is durable, then walked in "
        "the background"
    ),
    description=(
        "Every agent and tool the graph's nodes name is resolved first, so a run is started only "
        "when all of it resolves. Its events, status, stream, resume and abandon are an ordinary "
        "run's (a gate parks it as `suspended`). With `Accept: application/x-ndjson` the answer "
        "is a 200 stream instead of the 201, once the head is durable (every refusal is still "
        "the JSON envelope): a `started` line, a `node` line per node entered, finished or "
        "skipped (a nested flow's under its child run's id), a `keepalive` line after 15 s of "
        "silence, and last, once the run rests, a `result` line with the baselines a run that "
        "updates them captured and the files its authoring tools saved for the client. A "
        "daemon that stops ends the stream with no `result`; the run goes on whether or not the "
        "caller stays. With `X-Salvor-Linked: 1` the run tree is marked linked (the label "
        "`salvor.linked`, the client's project root): `flow_write` and `flow_agents` write in "
        "it save nothing here, answering `saved_to` for the client, and refuse what a linked "
        "run would."
    ),
    parameters=(
        {
            "name": "X-Salvor-Linked",
            "in": "header",
            "schema": {"enum": ["1"]},
            "description": "`1`: the caller is a client on the project's machine; what the run's "
            "agents author is saved there (`client_files`), never on this daemon.",
        },
    ),
    body=START_GRAPH_RUN,
    answers={"201": ("The run exists; watch it on its event stream.", RUN_STARTED)},
    refusals=("PayloadTooLarge",),
    responses={
        "200": STREAM_ANSWER,
        "429": TOO_MANY_STREAMS,
        "400": error(
            "Malformed body or labels over the bounds (with `X-Salvor-Linked`, at most 15: the "
            "daemon adds `salvor.linked`), a node naming a process or service "
            "agent (`details.node`; agent nodes run built-in agents), or a graph by hash or a "
            "flow sent without `members` whose nodes need files (each named; the client must be "
            "one that sends them) (`bad_request`); a flow that "
            "fails its pre-check, every reason in `details.errors` with its node "
            "(`invalid_graph`). Nothing recorded.",
            "bad_request",
            "invalid_graph",
        ),
        "422": error(
            "A flow member's or the flow file's bytes fail a check (not base64, not the size "
            "declared, over 32 MiB for a file or for the call's members), or a member names an "
            "upload this daemon does not hold (unknown, spent by an earlier call, or swept) or "
            "not by its archive's hash. Nothing recorded; every upload the call names is spent.",
            "invalid_flow_files",
        ),
        "404": error(
            "No graph stored under `graph_hash` (`unknown_graph`), no flow kept as `flow_name` "
            "(`unknown_flow`), or a node names an agent that "
            "is not registered or a tool this daemon lacks (`unknown_agent` / `unknown_tool`, "
            "`details.node`). Nothing recorded.",
            "unknown_graph",
            "unknown_flow",
            "unknown_agent",
            "unknown_tool",
        ),
        "503": error(
            "A node calls a tool and this daemon's host wired no tool registry "
            "(`details.node`, `details.tool`). Nothing recorded.",
            "tool_registry_unavailable",
        ),
    },
)
OPERATIONS = (START,)


def add_graph_run_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, START)
    async def start_graph_run():
        body = await _start_body(await body_bytes(), runtime.uploads)
        slot = None
        if wants_stream():
            # Taken before the run starts: a refused stream (429) leaves nothing recorded, and
            # the uploads it names spent, as every refusal does.
            slot = state.stream_slots.take(request.remote_addr)
            if not isinstance(slot, StreamSlot):
                await runtime.uploads.discard(_named(body))
                return slot
        try:
            run_id = await _start(runtime, body)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        state.drivers.start(run_id)
        if slot is not None:
            return stream_response(app, state, run_id, slot, flow_run="flow" in body)
        return RUN_STARTED.respond(201, run=run_id, status="running")


async def _start(runtime, body: dict) -> str:
    """Start the run the body asks for; its head is durable once this returns (a daemon killed
    right after the answer still has the run, and recovery walks it).

    Raises:
        OperationRefused: every refusal of the route; nothing was recorded.
    """
    if "flow_name" in body:
        _no_nul_but_keys(body)
        return await start_named_flow(runtime, body["flow_name"], body)
    if "flow" not in body:
        _no_nul_but_keys(body)
        graph = await runtime.definitions.load_graph(body["graph_hash"])
        labels = linked_labels(body.get("labels"), None)
        return await runtime.starts.start_graph_run(graph, body.get("input"), labels=labels)
    files = await _sent_flow(body, runtime.uploads)
    if "members" not in body:
        # A client that does not know members sent the flow file alone.
        unsent = flow_without_members(files, runtime.kit.registry.file_inputs())
        if unsent is not None:
            raise bad_request(unsent)
    labels = linked_labels(body.get("labels"), files.bundle)
    return await runtime.starts.start_flow_run(files, body.get("input"), labels=labels)


async def _start_body(data: bytes, uploads: Uploads) -> dict:
    """The call's body, checked whole. A flow's member keys carry a NUL by design (directory,
    NUL, target), so NULs are let through here and held to the store's rule by the caller.

    Raises:
        OperationRefused: what ``Body.from_bytes`` raises; every upload the body names (as far
            as it reads as JSON) was deleted first.
    """
    try:
        return START_GRAPH_RUN.from_bytes(data, request.mimetype or "", nul=True)
    except OperationRefused:
        await uploads.discard(_uploads_in(data))
        raise


def _uploads_in(data: bytes) -> list[str]:
    """The upload ids a body that failed its checks names, read as leniently as it allows."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return []
    return _named(body) if isinstance(body, dict) else []


def _named(body: dict) -> list[str]:
    """The upload ids a body names (its flow file's and its members')."""
    return named_uploads(body.get("flow"), body.get("members"))


async def _sent_flow(body: dict, uploads: Uploads) -> FlowFiles:
    """The files of a flow sent with the call, as the linked bundle they make. The uploads the
    call names are taken (deleted) first of all, so every refusal below leaves them spent.

    Raises:
        OperationRefused: invalid_flow_files (422) for bytes that fail a check or an upload
            not held as named, bad_request for a flow or member that is not the shape or a NUL
            outside a member's key; nothing was kept.
    """
    members = body.get("members", [])
    taken = await uploads.take(named_uploads(body["flow"], members))
    _no_nul_but_keys(body)
    try:
        bundle, contents = flow_from_call(
            body["flow"],
            members,
            update_baselines=body.get("update_baselines") is True,
            uploads=taken,
        )
    except BadFlowBytes as exc:
        raise OperationRefused(ErrorCode.INVALID_FLOW_FILES, str(exc)) from None
    except MalformedBundle as exc:
        raise bad_request(f"the flow sent is not the shape: {exc}") from None
    return FlowFiles(bundle, contents)


def _no_nul_but_keys(body: dict) -> None:
    """Refuse a NUL anywhere in ``body`` but a member's key (400 bad_request)."""
    members = body.get("members")
    rest = {name: value for name, value in body.items() if name != "members"}
    if isinstance(members, list):
        rest["members"] = [
            {name: value for name, value in member.items() if name != "key"}
            if isinstance(member, dict)
            else member
            for member in members
        ]
    try:
        check_document(rest, "the body")
    except MalformedJson as exc:
        raise bad_request(exc.message) from None
