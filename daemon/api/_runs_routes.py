"""``/v1/runs``: start a run (or a re-run), list runs, read one run's status (a subagent's child
names its ``parent``), its children and its replay."""

from __future__ import annotations

import re

from quart import request
from quart_trio import QuartTrio
from salvor.protocol import RunState, fold, status_seen_at
from salvor.store import RunSummary

from ..flows import PARENT_LABEL
from ..recording import parse_run_id
from ..web import bad_request
from ._answers import CHILD_LIST, RUN, RUN_LIST, RUN_STARTED
from ._bodies import START_RUN
from ._http import json_response
from ._operation import RUN_ID, Operation, error, route
from ._queries import HASH_PATTERN, RUNS_QUERY, page_of
from ._schema import ref
from ._state import ServerState

START = Operation(
    method="post",
    rule="/v1/runs",
    operation_id="startRun",
    new_work=True,
    tag="runs",
    summary="Start a run; answered once its head event is durable, then driven in the background",
    body=START_RUN,
    answers={"201": ("The run exists; watch it on its event stream.", RUN_STARTED)},
    refusals=("BadRequest", "PayloadTooLarge"),
    responses={
        "404": error(
            "The agent is not registered, or the run named by replay_of does not exist.",
            "unknown_agent",
            "unknown_run",
        ),
        "409": error(
            "The chosen run_id already has history (`run_exists`), the run named by replay_of has "
            "not completed (`wrong_state`), or the agent is a service whose proxy port another "
            "live run of this daemon holds (`port_held`; `details.port` and `details.run` name "
            "them). Nothing recorded.",
            "run_exists",
            "wrong_state",
            "port_held",
        ),
    },
)
LIST = Operation(
    method="get",
    rule="/v1/runs",
    operation_id="listRuns",
    tag="runs",
    summary="List runs, newest first, with their folded status",
    parameters=tuple(RUNS_QUERY.described()),
    answers={"200": ("One page of runs.", RUN_LIST)},
    refusals=("BadRequest",),
)
READ = Operation(
    method="get",
    rule="/v1/runs/<run_id>",
    operation_id="getRun",
    tag="runs",
    summary="One run's derived state",
    parameters=RUN_ID,
    answers={"200": ("The run.", RUN)},
    refusals=("BadRequest", "UnknownRun"),
)
CHILDREN = Operation(
    method="get",
    rule="/v1/runs/<run_id>/children",
    operation_id="listRunChildren",
    tag="runs",
    summary=(
        "An extension: the child runs a run's subagent calls started, oldest first (a derived "
        "index, as `GET /v1/runs?label=salvor.parent:{run_id}` lists them)"
    ),
    parameters=RUN_ID,
    answers={"200": ("The children.", CHILD_LIST)},
    refusals=("BadRequest", "UnknownRun"),
)
REPLAY = Operation(
    method="get",
    rule="/v1/runs/<run_id>/replay",
    operation_id="replayRun",
    tag="runs",
    summary="Dry-run replay: the state folded from the log, executing nothing",
    parameters=RUN_ID,
    answers={"200": ("The projection.", ref("Replay"))},
    refusals=("BadRequest", "UnknownRun"),
)
OPERATIONS = (START, LIST, READ, CHILDREN, REPLAY)


def add_run_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, START)
    async def start_run():
        body = await START_RUN.read()
        replay_of, run_id, labels = body.get("replay_of"), body.get("run_id"), body.get("labels")
        if replay_of is not None and "input" in body:
            raise bad_request(
                "a re-run takes its origin's input; leave `input` out when `replay_of` is given"
            )
        if "agent" in body:
            agent = await runtime.definitions.load_agent(body["agent"])
        else:
            # A re-run defaults to the origin's own agent (whose command may
            # now run newer code: that is what a re-run checks).
            agent = await runtime.definitions.load_agent(
                (await runtime.reads.view(replay_of)).agent_def_hash
            )
        # The head is durable before we answer: a daemon killed right after
        # the 201 still has the run, and recovery drives it.
        run_id = await runtime.starts.start_run(
            agent,
            body.get("input"),
            labels=labels,
            run_id=run_id,
            register=False,
            replay_of=replay_of,
        )
        state.drivers.start(run_id, agent)
        return RUN_STARTED.respond(201, run=run_id, status="running", replay_of=replay_of)

    @route(app, LIST)
    async def list_runs():
        page, next_cursor = await runtime.reads.list_runs(**_list_filters(request.args))
        return RUN_LIST.respond(runs=await summaries_json(state, page), next_cursor=next_cursor)

    @route(app, READ)
    async def get_run(run_id: str):
        run_id = parse_run_id(run_id)
        view = await runtime.reads.view(run_id)
        return RUN.respond(
            run=run_id,
            status=view.status_at(runtime.kit.clock()),
            event_count=view.event_count,
            usage=view.usage(),
            pending=view.pending.to_json() if view.pending else None,
            first_recorded_at=view.first_recorded_at,
            last_recorded_at=view.last_recorded_at,
            replay_of=view.replay_of,
            parent=(view.labels or {}).get(PARENT_LABEL),
            agent_def_hash=view.agent_def_hash,
            graph_hash=view.graph_hash,
            labels=view.labels or None,
            driven_by=view.driven_by and view.driven_by.value,
            **await state.driver(run_id, view.state.value),
        )

    @route(app, CHILDREN)
    async def run_children(run_id: str):
        run_id = parse_run_id(run_id)
        children = await runtime.reads.list_children(run_id)
        return CHILD_LIST.respond(
            run=run_id, derived=True, children=await summaries_json(state, children)
        )

    @route(app, REPLAY)
    async def replay(run_id: str):
        # A pure fold of the recorded log, executing nothing.
        view = fold(await runtime.reads.log(parse_run_id(run_id)))
        return json_response(view.replay_json())


def _list_filters(args) -> dict:
    """The store's filters for ``GET /v1/runs`` from its query (refused whole when one is bad)."""
    RUNS_QUERY.refuse_unknown(args)
    status = args.get("status")
    if status is not None and status not in RunState.__members__.values():
        raise bad_request(f"`status` must be one of {', '.join(s.value for s in RunState)}")
    label = None
    if "label" in args:
        key, sep, value = args["label"].partition(":")
        if not sep or not key:
            raise bad_request("`label` must look like key:value")
        label = (key, value)
    hashes = {}
    for name, column in (("agent", "agent_def_hash"), ("graph", "graph_hash")):
        if name in args:
            if not re.fullmatch(HASH_PATTERN, args[name]):
                raise bad_request(f"`{name}` must be a hash like sha256:<64 hex digits>")
            hashes[column] = args[name]
    return {"state": status, "label": label, **hashes, **page_of(args)}


async def summaries_json(state: ServerState, summaries: list[RunSummary]) -> list[dict]:
    """A page of ``GET /v1/runs`` entries (one read of the leases for the page)."""
    drivers = await state.driver_fields([(s.run_id, s.state) for s in summaries])
    return [summary_body(s, state, drivers[s.run_id]) for s in summaries]


def summary_body(summary: RunSummary, state: ServerState, driver: dict) -> dict:
    """A run's listing entry, with its ``driver`` field as worked out by the caller (the live
    connection's ``run`` rows share it)."""
    body = summary.to_json()
    if "status" in body:
        # The stored status is the fold's; overdue is relative to now, as on GET /v1/runs/{id}.
        body["status"] = status_seen_at(body["status"], state.runtime.kit.clock())
    body.update(driver)
    return body
