"""The verbs a person (or a client) applies to a run: ``POST /v1/runs/{id}/resume``, ``/resolve``
and ``/abandon``."""

from __future__ import annotations

from quart_trio import QuartTrio

from ..recording import parse_run_id
from ..runs import MISSING, ResumeOutcome
from ._answers import ABANDONED, RESOLVED, RESUME_DRIVING, RESUME_FINISHED
from ._bodies import ABANDON, RESOLVE_RUN, RESUME
from ._state import ServerState, refuse_if_driven_elsewhere


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
        return RESOLVED.respond(run=run_id, resolved=True, status=view.status())

    @app.post("/v1/runs/<run_id>/abandon")
    async def abandon(run_id: str):
        run_id = parse_run_id(run_id)
        body = await ABANDON.read()
        seq, view = await runtime.abandon(run_id, body.get("reason"))
        return ABANDONED.respond(run=run_id, abandoned=True, appended_seq=seq, status=view.status())
