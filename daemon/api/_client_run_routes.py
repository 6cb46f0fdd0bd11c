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
from ._bodies import APPEND_EVENTS, OPEN_CLIENT_RUN, RESOLVE
from ._http import json_response
from ._state import ServerState

TOKEN_HEADER = "X-Drive-Token"


def presented() -> str | None:
    """The drive token the request presents, if any."""
    return request.headers.get(TOKEN_HEADER)


def add_client_run_routes(app: QuartTrio, state: ServerState) -> None:
    client_runs = state.client_runs

    @app.post("/v1/client-runs")
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

    @app.post("/v1/client-runs/<run_id>/release")
    async def release(run_id: str):
        run_id = parse_run_id(run_id)
        return RELEASED.respond(released=client_runs.release(run_id, presented()))

    @app.post("/v1/client-runs/<run_id>/heartbeat")
    async def heartbeat(run_id: str):
        run_id = parse_run_id(run_id)
        lapses_in = await client_runs.heartbeat(run_id, presented())
        return LEASE_LAPSE.respond(lapses_in_seconds=lapses_in)

    @app.get("/v1/client-runs/<run_id>/log")
    async def client_log(run_id: str):
        run_id = parse_run_id(run_id)
        from_seq = whole_number(request.args.get("from_seq", "0"))
        if from_seq is None:
            raise bad_request("`from_seq` must be a whole number (ASCII digits only)")
        log = await client_runs.read_log(run_id, from_seq)
        return CLIENT_LOG.respond_with_log(200, log)

    @app.post("/v1/client-runs/<run_id>/resolve")
    async def client_resolve(run_id: str):
        # The driver itself, token in hand: it keeps its lease.
        run_id = await client_runs.driving(run_id, presented())
        body = await RESOLVE.read()
        await client_runs.resolve(run_id, body["output"])
        return CLIENT_RESOLVED.respond(run=run_id, resolved=True)

    # `salvor serve` answers this route in front of Quart (``_front``), through
    # the same two calls; the route keeps it in this app's table, so other
    # methods get their 405 and it answers alike without the front.
    @app.post("/v1/client-runs/<run_id>/events")
    async def append(run_id: str):
        run_id = await client_runs.driving(run_id, presented())
        return json_response(await client_runs.append(run_id, await APPEND_EVENTS.read()))
