"""The verbs a person (or a client) applies to a run: ``POST /v1/runs/{id}/resume``, ``/resolve``
and ``/abandon``.

A resolve settles the write a run was parked on, which leaves the run exactly where an interrupted
one is: the daemon drives it on at once, as its recovery would at the next start, rather than
leave it ``running`` with no driver until someone resumes it or the daemon restarts. An abandoned
child leaves the run waiting on it the same way, and it is driven on the same way.
"""

from __future__ import annotations

import logging

import trio
from quart_trio import QuartTrio
from salvor.protocol import Actor, RunView

from ..recording import parse_run_id
from ..runs import MISSING, ResumeOutcome, driver_of
from ..web import OperationRefused
from ._answers import ABANDONED, RESOLVED, RESUME_DRIVING, RESUME_FINISHED
from ._bodies import ABANDON, RESOLVE_RUN, RESUME
from ._operation import RUN_ID, Operation, error, error_schema, route
from ._schema import ref
from ._state import ServerState, refuse_if_driven_elsewhere

log = logging.getLogger("salvor.api")


async def drive_on_after_resolve(state: ServerState, run_id: str, view: RunView) -> None:
    """Drive a server-driven run on once a resolve has settled its write (or a child it waits
    on was abandoned).

    A client-driven run is its client's to drive (it re-opens the run), and a run another live
    ``salvor`` beside this daemon drives goes on there. A run this daemon cannot drive (its agent
    or graph is not stored here) stays as recovery would leave it: ``running``, no driver, and a
    ``POST /v1/runs/{id}/resume`` says what is missing. Either way the resolve stands.
    """
    if view.driven_by == Actor.CLIENT or view.terminal:
        return
    if state.driven_elsewhere is not None and run_id in await trio.to_thread.run_sync(
        state.driven_elsewhere, [run_id]
    ):
        return
    try:
        decision = await state.runtime.control.resume(run_id)
    except OperationRefused as refused:
        log.warning("run %s resolved, not driven on here: %s", run_id, refused.message)
        return
    if decision.outcome is ResumeOutcome.DRIVING:
        state.drivers.start(run_id)


_WRONG_STATE = ("wrong_state", "divergence")

RESUME_RUN = Operation(
    method="post",
    rule="/v1/runs/<run_id>/resume",
    operation_id="resumeRun",
    tag="runs",
    summary="Continue a run: a parked one with an input, an interrupted one without",
    parameters=RUN_ID,
    body=RESUME,
    answers={
        "200": ("The run had already finished; left alone.", RESUME_FINISHED),
        "202": ("The run is driving again; open its stream to watch.", RESUME_DRIVING),
    },
    refusals=("UnknownRun", "PayloadTooLarge"),
    responses={
        "400": error(
            "Malformed body, a bad run id, or an input the run's recorded schema rejects "
            "(`bad_request`, `details.violations`); a graph run parked at a gate answers an "
            "approval its `approval_schema` rejects with `approval_schema_violation` "
            "(`details.node`, `details.violations`). Nothing recorded.",
            "bad_request",
            "approval_schema_violation",
        ),
        "404": error(
            "No run under that id, or its agent (or graph) is not registered here.",
            "unknown_run",
            "unknown_agent",
            "unknown_graph",
        ),
        "409": error(
            "needs_reconciliation (`details.intent`: the dangling write), still_sleeping "
            "(`details.wake_at`, `details.remaining_seconds`), or client_driven_run. Nothing "
            "recorded.",
            schema={
                "oneOf": [
                    ref("NeedsReconciliationError"),
                    ref("StillSleepingError"),
                    error_schema(["client_driven_run", "divergence"]),
                ]
            },
        ),
        "503": error(
            "A graph run's node calls a tool and this daemon's host wired no tool registry "
            "(`details.node`, `details.tool`). Nothing recorded.",
            "tool_registry_unavailable",
        ),
    },
)
RESOLVE_WRITE = Operation(
    method="post",
    rule="/v1/runs/<run_id>/resolve",
    operation_id="resolveRun",
    tag="runs",
    summary=(
        "Record by hand what a dangling write returned, or that it did not land (settled_by: "
        "operator); a server-driven run is then driven on"
    ),
    description=(
        "`output`: the write happened and returned it (a client's write is checked against its "
        "declaration). `not_landed: true`: it did not happen; it is recorded as a failed call, "
        "its idempotency identity is given up, and the next call with it performs the write "
        "afresh under the same key. Exactly one of the two. A server-driven run this daemon "
        "holds the agent (or graph) of is then driven on, as recovery would drive it; a client's "
        "run waits for its client."
    ),
    parameters=RUN_ID,
    body=RESOLVE_RUN,
    answers={"200": ("Recorded; a server-driven run goes on by itself.", RESOLVED)},
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge"),
    responses={"409": error("The run has no dangling write.", *_WRONG_STATE)},
)
ABANDON_RUN = Operation(
    method="post",
    rule="/v1/runs/<run_id>/abandon",
    operation_id="abandonRun",
    tag="runs",
    summary="Retire an unfinished run with a terminal RunAbandoned",
    description=(
        "A drive of the run in this daemon is stopped first: a process agent's process group is "
        "killed and waited for, and what the drive records on its way out lands before "
        "RunAbandoned, the run's last event. Its subagent children and map items that have not "
        "ended are abandoned after it, and a run waiting on it (a subagent's parent, a map "
        "item's graph run) is driven on, hearing how it ended. A later call from a process of "
        "the run (one that left its group) is refused in its wire's error shape."
    ),
    parameters=RUN_ID,
    body=ABANDON,
    answers={
        "200": (
            "Abandoned; an abandoned dangling write is named in `status.unresolved_write`.",
            ABANDONED,
        )
    },
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge"),
    responses={"409": error("The run is already terminal.", *_WRONG_STATE)},
)
OPERATIONS = (RESUME_RUN, RESOLVE_WRITE, ABANDON_RUN)


def add_run_verb_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, RESUME_RUN)
    async def resume(run_id: str):
        run_id = parse_run_id(run_id)
        body = await RESUME.read()
        await refuse_if_driven_elsewhere(state, run_id)
        decision = await runtime.control.resume(run_id, body.get("input", MISSING))
        if decision.outcome is ResumeOutcome.FINISHED:
            return RESUME_FINISHED.respond(
                run=run_id, outcome=decision.view.state.value, status=decision.view.status()
            )
        state.drivers.start(run_id)
        # Answered once the drive shows in the store: a stream or a read on another node
        # (another worker) asked right after this answer sees the run driven, not resting at
        # the write its drive is about to probe.
        await state.drivers.shown(run_id)
        return RESUME_DRIVING.respond(202, run=run_id, status="running", outcome="driving")

    @route(app, RESOLVE_WRITE)
    async def resolve(run_id: str):
        run_id = parse_run_id(run_id)
        body = await RESOLVE_RUN.read()
        view = await runtime.control.resolve(
            run_id,
            body.get("output"),
            state.client_tools,
            not_landed=body.get("not_landed") is True,
        )
        # The driver that left the write open is gone (whoever resolves it
        # presented no drive token), so its hold goes with the resolution.
        await state.leases.drop(run_id)
        await drive_on_after_resolve(state, run_id, view)
        return RESOLVED.respond(run=run_id, resolved=True, status=view.status())

    @route(app, ABANDON_RUN)
    async def abandon(run_id: str):
        run_id = parse_run_id(run_id)
        body = await ABANDON.read()
        seq, view = await runtime.control.abandon(run_id, body.get("reason"))
        # A child's end is the next step of the run that waits on it (a subagent's parent, a map
        # item's graph run), whose walk the abandon may have stopped: it goes on and hears it.
        parent = driver_of(view)
        found = None if parent is None else await runtime.reads.find_view(parent)
        if found is not None:
            await drive_on_after_resolve(state, parent, found)
        return ABANDONED.respond(run=run_id, abandoned=True, appended_seq=seq, status=view.status())
