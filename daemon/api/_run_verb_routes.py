"""The verbs a person (or a client) applies to a run: ``POST /v1/runs/{id}/resume``, ``/resolve``
and ``/abandon``.

A resolve settles the write a run was parked on, which leaves the run exactly where an interrupted
one is: the daemon drives it on at once, as its recovery would at the next start, rather than
leave it ``running`` with no driver until someone resumes it or the daemon restarts.
"""

from __future__ import annotations

import logging

import trio
from quart_trio import QuartTrio
from salvor.protocol import Actor, RunView

from ..recording import parse_run_id
from ..runs import MISSING, ResumeOutcome
from ..web import OperationRefused
from ._answers import ABANDONED, RESOLVED, RESUME_DRIVING, RESUME_FINISHED
from ._bodies import ABANDON, RESOLVE_RUN, RESUME
from ._state import ServerState, refuse_if_driven_elsewhere

log = logging.getLogger("salvor.api")


async def drive_on_after_resolve(state: ServerState, run_id: str, view: RunView) -> None:
    """Drive a server-driven run on once a resolve has settled its write.

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
        decision = await state.runtime.resume(run_id)
    except OperationRefused as refused:
        log.warning("run %s resolved, not driven on here: %s", run_id, refused.message)
        return
    if decision.outcome is ResumeOutcome.DRIVING:
        state.drivers.start(run_id)


def add_run_verb_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @app.post("/v1/runs/<run_id>/resume")
    async def resume(run_id: str):
        run_id = parse_run_id(run_id)
        body = await RESUME.read()
        await refuse_if_driven_elsewhere(state, run_id)
        decision = await runtime.resume(run_id, body.get("input", MISSING))
        if decision.outcome is ResumeOutcome.FINISHED:
            return RESUME_FINISHED.respond(
                run=run_id, outcome=decision.view.state.value, status=decision.view.status()
            )
        state.drivers.start(run_id)
        return RESUME_DRIVING.respond(202, run=run_id, status="running", outcome="driving")

    @app.post("/v1/runs/<run_id>/resolve")
    async def resolve(run_id: str):
        run_id = parse_run_id(run_id)
        body = await RESOLVE_RUN.read()
        view = await runtime.resolve(
            run_id,
            body.get("output"),
            state.client_tools,
            not_landed=body.get("not_landed") is True,
        )
        # The driver that left the write open is gone (whoever resolves it
        # presented no drive token), so its hold goes with the resolution.
        state.leases.drop(run_id)
        await drive_on_after_resolve(state, run_id, view)
        return RESOLVED.respond(run=run_id, resolved=True, status=view.status())

    @app.post("/v1/runs/<run_id>/abandon")
    async def abandon(run_id: str):
        run_id = parse_run_id(run_id)
        body = await ABANDON.read()
        seq, view = await runtime.abandon(run_id, body.get("reason"))
        return ABANDONED.respond(run=run_id, abandoned=True, appended_seq=seq, status=view.status())
