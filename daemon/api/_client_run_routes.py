"""``/v1/client-runs``: open a client-driven run and hold its lease, read its log, append the
events the client's own cursor produced, resolve its dangling write.

The client opens a run and gets a drive token (a lease); every driving call
presents it in ``X-Drive-Token``. Model and tool events never come through
the generic append: they have routes of their own (``_model_step_routes``,
``_tool_step_routes``), where the daemon decides effects and keys. Every
refusal records nothing: a batch is validated whole before its first event
is written.
"""

from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from ..recording import parse_run_id
from ..web import bad_request, whole_number
from ._answers import CLIENT_LOG, CLIENT_RESOLVED, CLIENT_RUN_OPENED, LEASE_LAPSE, RELEASED
from ._bodies import RESOLVE
from ._client_run_bodies import APPEND_EVENTS, OPEN_CLIENT_RUN
from ._http import json_response
from ._operation import (
    DRIVE_FORBIDDEN,
    DRIVE_MISSING,
    DRIVE_TOKEN,
    DRIVEN,
    RUN_ID,
    WHOLE,
    Operation,
    error,
    error_schema,
    route,
)
from ._schema import ref
from ._state import ServerState

TOKEN_HEADER = "X-Drive-Token"
TAG = "client-driven runs"

OPEN = Operation(
    method="post",
    rule="/v1/client-runs",
    operation_id="openClientRun",
    tag=TAG,
    summary=(
        "Open a client-driven run (201), or re-open one: its holder keeps its token, an unheld or "
        "adopted run gets a fresh lease (200)"
    ),
    parameters=(DRIVE_TOKEN,),
    body=OPEN_CLIENT_RUN,
    answers={
        "201": ("A fresh run: append its RunStarted at seq 0.", CLIENT_RUN_OPENED),
        "200": ("A re-opened run with its recorded log.", CLIENT_RUN_OPENED),
    },
    refusals=("BadRequest", "PayloadTooLarge"),
    responses={
        "409": error(
            "Another driver's lease is current (`details.lapses_in_seconds`), or the id is a "
            "server-driven run.",
            schema=error_schema(["lease_held", "run_exists"]),
        )
    },
)
RELEASE = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/release",
    operation_id="releaseClientRun",
    tag=TAG,
    summary="Hand the lease back (idempotent: `released` is false when nothing was held)",
    parameters=DRIVEN,
    answers={"200": ("Released, or nothing to release.", RELEASED)},
    refusals=("BadRequest",),
    responses={"403": DRIVE_FORBIDDEN},
)
HEARTBEAT = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/heartbeat",
    operation_id="heartbeatClientRun",
    tag=TAG,
    summary="Refresh the lease without driving (for a driver inside a long body)",
    parameters=DRIVEN,
    answers={"200": ("The lease's whole TTL as of this beat.", LEASE_LAPSE)},
    refusals=("BadRequest", "UnknownRun"),
    responses={"401": DRIVE_MISSING, "403": DRIVE_FORBIDDEN},
)
LOG = Operation(
    method="get",
    rule="/v1/client-runs/<run_id>/log",
    operation_id="getClientRunLog",
    tag=TAG,
    summary=("A client-driven run's recorded envelopes (`from_seq` for the tail); no token needed"),
    parameters=(*RUN_ID, {"name": "from_seq", "in": "query", "schema": WHOLE}),
    answers={"200": ("The envelopes.", CLIENT_LOG)},
    refusals=("BadRequest", "UnknownRun"),
)
RESOLVE_WRITE = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/resolve",
    operation_id="clientResolve",
    tag=TAG,
    summary=(
        "The driver records what its dangling write did (checked against the declaration); it "
        "keeps its lease"
    ),
    parameters=DRIVEN,
    body=RESOLVE,
    answers={"200": ("Recorded; the run is drivable again.", CLIENT_RESOLVED)},
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge"),
    responses={
        "401": DRIVE_MISSING,
        "403": DRIVE_FORBIDDEN,
        "409": error("No dangling write to resolve.", "wrong_state", "divergence"),
    },
)
APPEND = Operation(
    method="post",
    rule="/v1/client-runs/<run_id>/events",
    operation_id="appendClientRunEvents",
    tag=TAG,
    summary=(
        "The guarded append: control and context events the client's cursor produced, checked "
        "whole before anything is written"
    ),
    parameters=DRIVEN,
    body=APPEND_EVENTS,
    answers={
        "200": (
            "Appended (a byte-identical retry is reported and changes nothing).",
            ref("Appended"),
        )
    },
    # A new run's head is new work: refused below the free-space floor.
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge", "InsufficientStorage"),
    responses={
        "401": DRIVE_MISSING,
        "403": DRIVE_FORBIDDEN,
        "409": error("Not the legal next event, or other bytes at a recorded seq.", "divergence"),
        "422": error(
            "A model or tool event: those have endpoints of their own.", "unsupported_event_kind"
        ),
    },
)
OPERATIONS = (OPEN, RELEASE, HEARTBEAT, LOG, RESOLVE_WRITE, APPEND)


def presented() -> str | None:
    """The drive token the request presents, if any."""
    return request.headers.get(TOKEN_HEADER)


def add_client_run_routes(app: QuartTrio, state: ServerState) -> None:
    client_runs = state.client_runs

    @route(app, OPEN)
    async def open_client_run():
        body = await OPEN_CLIENT_RUN.read()
        opened = await client_runs.open(
            body.get("run_id"), presented(), record_prompts=body.get("record_prompts", False)
        )
        return CLIENT_RUN_OPENED.respond_with_log(
            201 if opened.fresh else 200,
            opened.log,
            run=opened.run_id,
            drive_token=opened.drive_token,
        )

    @route(app, RELEASE)
    async def release(run_id: str):
        run_id = parse_run_id(run_id)
        return RELEASED.respond(released=await client_runs.release(run_id, presented()))

    @route(app, HEARTBEAT)
    async def heartbeat(run_id: str):
        run_id = parse_run_id(run_id)
        lapses_in = await client_runs.heartbeat(run_id, presented())
        return LEASE_LAPSE.respond(lapses_in_seconds=lapses_in)

    @route(app, LOG)
    async def client_log(run_id: str):
        run_id = parse_run_id(run_id)
        from_seq = whole_number(request.args.get("from_seq", "0"))
        if from_seq is None:
            raise bad_request("`from_seq` must be a whole number (ASCII digits only)")
        log = await client_runs.read_log(run_id, from_seq)
        return CLIENT_LOG.respond_with_log(200, log)

    @route(app, RESOLVE_WRITE)
    async def client_resolve(run_id: str):
        # The driver itself, token in hand: it keeps its lease.
        run_id = await client_runs.driving(run_id, presented())
        body = await RESOLVE.read()
        await client_runs.resolve(run_id, body["output"])
        return CLIENT_RESOLVED.respond(run=run_id, resolved=True)

    # `salvor serve` answers this route in front of Quart (``_front``), through
    # the same two calls; the route keeps it in this app's table, so other
    # methods get their 405 and it answers alike without the front.
    @route(app, APPEND)
    async def append(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        return json_response(await client_runs.append(run_id, await APPEND_EVENTS.read()))
