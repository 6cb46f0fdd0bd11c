"""The control-plane HTTP API (quart-trio): agents, runs, their verbs and capabilities.

Handlers do the fast part (validate, refuse a bad state, record the head or
the resume) and hand driving to the driving set; they never wait for a model
or a tool. Every refusal is the one error envelope and records nothing.

Bodies are the control-plane spec's, field for field. Where we say more, it
is an optional addition a spec-written client never has to send and may
ignore: ``replay_of`` (a re-run) on ``POST /v1/runs`` and in its answer and
on ``GET /v1/runs/{id}``; the ``status``, ``label``, ``limit`` and ``cursor``
query of ``GET /v1/runs`` with its ``next_cursor`` (without them the list is
whole, as the spec has it); ``GET /v1/health`` and ``GET /v1/openapi.json``.
``GET /v1/capabilities`` advertises ``fork: false``: forks are not built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from quart import request
from quart_trio import QuartTrio
from salvor import __version__
from salvor.protocol import (
    TERMINAL_STATES,
    CodedError,
    ErrorCode,
    RunState,
    excerpt,
    fold,
    status_seen_at,
)
from salvor.store import RunSummary
from werkzeug.exceptions import HTTPException

from ..agents import Credentials, DefinitionError, parse_definition
from ..client_runs import ClientAppends, ClientTool, LeaseRegistry
from ..models import ModelGateway
from ..recording import parse_run_id
from ..runs import MISSING, DriverSet, EventHub, ResumeOutcome, Runtime
from ..web import (
    BODY_TIMEOUT_SECONDS,
    OperationRefused,
    bad_request,
    body_bytes,
    check_bearer,
    error_response,
    internal,
    json_response,
    unknown_agent,
    whole_number,
    wrong_state,
)
from ._answers import (
    ABANDONED,
    AGENT_CREATED,
    CAPABILITIES,
    HEALTH,
    RESOLVED,
    RESUME_DRIVING,
    RESUME_FINISHED,
    RUN,
    RUN_STARTED,
)
from ._bodies import ABANDON, RESOLVE, RESUME, START_RUN
from ._client_runs import add_client_run_routes
from ._openapi import openapi_document
from ._queries import MAX_PAGE, RUNS_QUERY
from ._stream import add_stream_route

log = logging.getLogger("salvor.api")

# Quart's own refusals by status; any other is a bad_request (400), as the table has it.
_HTTP_CODES = {
    code.status: code
    for code in (
        ErrorCode.NOT_FOUND,
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.REQUEST_TIMEOUT,
        ErrorCode.PAYLOAD_TOO_LARGE,
    )
}
_TERMINAL = {state.value for state in TERMINAL_STATES}


async def refuse_if_driven_elsewhere(state: ServerState, run_id: str) -> None:
    """Refuse (409 wrong_state, nothing recorded) to drive a run a live
    `salvor run` beside us drives."""
    if state.driven_elsewhere is None:
        return
    if run_id in await trio.to_thread.run_sync(state.driven_elsewhere, [run_id]):
        raise wrong_state(
            f"run {run_id} is being driven by another salvor process beside this daemon "
            "(a `salvor run`); let it finish, or stop it first, then resume it here"
        )


@dataclass
class ServerState:
    """What the routes share: one runtime, one driving set, one fan-out."""

    runtime: Runtime
    drivers: DriverSet
    hub: EventHub
    auth_token: str | None = None
    commit: str | None = None
    stream_poll_seconds: float = 1.0
    heartbeat_seconds: float = 15.0
    detach_grace_seconds: float = 5.0
    # How long any request body may take to arrive whole before it is answered 408.
    body_timeout_seconds: float = BODY_TIMEOUT_SECONDS
    # Whether POST /v1/agents accepts process agents (commands this daemon runs).
    allow_process_agents: bool = False
    # The model endpoints and MCP origins the operator declared: all a
    # definition from HTTP may name.
    credentials: Credentials = field(default_factory=Credentials)
    # Set when the daemon begins a graceful stop: open streams end at once.
    stopping: trio.Event = field(default_factory=trio.Event)
    # Drive-token holds on client-driven runs.
    leases: LeaseRegistry = field(default_factory=LeaseRegistry)
    # The model client that performs client-driven runs' model steps (None: not configured).
    model_executor: ModelGateway | None = None
    # Client-performed tools the operator declared (salvor serve --client-tool), by name.
    client_tools: dict[str, ClientTool] = field(default_factory=dict)
    # Which of the given runs another live salvor (a `salvor run` beside this
    # daemon) is driving right now; None when nothing else can drive here.
    # A blocking call (it asks the store's locks): run it in a thread.
    driven_elsewhere: Callable[[list[str]], set[str]] | None = None
    # The guarded append of client-driven runs (shared by its route and the ASGI front).
    client_appends: ClientAppends = field(init=False)

    def __post_init__(self) -> None:
        self.client_appends = ClientAppends(self.runtime.access, self.leases)

    def attached(self, run_id: str) -> bool:
        """Whether something drives the run right now: a driver task here,
        or a client's current lease."""
        return self.drivers.driving(run_id) or self.leases.holds(run_id)

    def driver(self, run_id: str, state: str | None) -> dict:
        """The ``driver`` field: absent for a terminal or unreadable run."""
        if state is None or state in _TERMINAL:
            return {}
        return {"driver": "attached" if self.attached(run_id) else "none"}


def create_app(state: ServerState) -> QuartTrio:
    # No static folder: every path this server answers is under /v1.
    app = QuartTrio("salvor", static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = None  # checked by the routes, as the envelope
    app.config["RESPONSE_TIMEOUT"] = None  # streams stay open as long as the run is live
    # Quart hands it to every request as ``request.body_timeout``; ``body_bytes`` applies it to the
    # whole body. (Quart's own use of it covers only get_data() and answers in HTML.)
    app.config["BODY_TIMEOUT"] = state.body_timeout_seconds
    runtime = state.runtime

    @app.before_request
    async def authenticate() -> None:
        check_bearer(state.auth_token)

    @app.errorhandler(CodedError)
    async def coded(error: CodedError):
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException):
        code = _HTTP_CODES.get(error.code, ErrorCode.BAD_REQUEST)
        message = {
            404: f"no route {excerpt(request.method)} {excerpt(request.path)}",
            405: f"{excerpt(request.method)} is not allowed on {excerpt(request.path)}",
        }.get(error.code, error.description or error.name)
        response = error_response(OperationRefused(code, message))
        if error.code == 405 and getattr(error, "valid_methods", None):
            # RFC 9110: a 405 names the methods the resource does support.
            response.headers["Allow"] = ", ".join(sorted(set(error.valid_methods) - {"OPTIONS"}))
        return response

    @app.errorhandler(Exception)
    async def unexpected(error: Exception):
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(internal())

    # -- agents -----------------------------------------------------------------

    @app.post("/v1/agents")
    async def register_agent():
        mimetype = request.mimetype or ""
        if mimetype in ("application/toml", "text/toml", "application/x-toml"):
            fmt = "toml"
        elif mimetype == "application/json" or mimetype.endswith("+json"):
            fmt = "json"
        else:
            raise bad_request("send the definition as application/toml or application/json")
        data = await body_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise bad_request("the definition is not UTF-8 text") from None
        try:
            agent = parse_definition(
                text,
                fmt,
                known_tools=runtime.registry.names(),
                allow_paths=False,
                allow_processes=state.allow_process_agents,
                credentials=state.credentials,
            )
        except DefinitionError as exc:
            raise bad_request(f"the agent definition does not build: {exc}") from None
        await runtime.build_agent(agent)
        created = await runtime.register_agent(agent)
        return AGENT_CREATED.respond(201, agent=agent.agent_def_hash, created=created)

    @app.get("/v1/agents")
    async def list_agents():
        stored = await runtime.list_agents()
        return json_response(
            {
                "agents": [
                    {"agent": a.agent_def_hash, **({"name": a.name} if a.name else {})}
                    for a in stored
                ]
            }
        )

    @app.get("/v1/agents/<agent_hash>")
    async def get_agent(agent_hash: str):
        stored = await runtime.find_agent(agent_hash)
        if stored is None:
            raise unknown_agent(agent_hash)
        body = {
            "agent": stored.agent_def_hash,
            "format": stored.format,
            "definition": stored.definition,
        }
        if stored.name:
            body["name"] = stored.name
        return json_response(body)

    # -- runs ---------------------------------------------------------------------

    @app.post("/v1/runs")
    async def start_run():
        body = await START_RUN.read()
        replay_of, run_id, labels = body.get("replay_of"), body.get("run_id"), body.get("labels")
        if replay_of is not None and "input" in body:
            raise bad_request(
                "a re-run takes its origin's input; leave `input` out when `replay_of` is given"
            )
        if "agent" in body:
            agent = await runtime.load_agent(body["agent"])
        else:
            # A re-run defaults to the origin's own agent (whose command may
            # now run newer code: that is what a re-run checks).
            agent = await runtime.load_agent((await runtime.view(replay_of)).agent_def_hash)
        # The head is durable before we answer: a daemon killed right after
        # the 201 still has the run, and recovery drives it.
        run_id = await runtime.start_run(
            agent,
            body.get("input"),
            labels=labels,
            run_id=run_id,
            register=False,
            replay_of=replay_of,
        )
        state.drivers.start(run_id, agent)
        return RUN_STARTED.respond(201, run=run_id, status="running", replay_of=replay_of)

    def summary_json(summary: RunSummary) -> dict:
        body = summary.to_json()
        if "status" in body:
            # The stored status is the fold's; overdue is relative to now, as on GET /v1/runs/{id}.
            body["status"] = status_seen_at(body["status"], runtime.clock())
        body.update(state.driver(summary.run_id, summary.state))
        return body

    @app.get("/v1/runs")
    async def list_runs():
        args = request.args
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
        limit = None
        if "limit" in args:
            limit = whole_number(args["limit"]) or 0
            if not 1 <= limit <= MAX_PAGE:
                raise bad_request(f"`limit` must be a whole number from 1 to {MAX_PAGE}")
        cursor = args.get("cursor")
        page, next_cursor = await runtime.list_runs(
            state=status, label=label, limit=limit, after=cursor
        )
        body: dict = {"runs": [summary_json(s) for s in page]}
        if next_cursor is not None:
            body["next_cursor"] = next_cursor
        return json_response(body)

    @app.get("/v1/runs/<run_id>")
    async def get_run(run_id: str):
        run_id = parse_run_id(run_id)
        view = await runtime.view(run_id)
        return RUN.respond(
            run=run_id,
            status=view.status_at(runtime.clock()),
            event_count=view.event_count,
            usage=view.usage(),
            pending=view.pending.to_json() if view.pending else None,
            first_recorded_at=view.first_recorded_at,
            last_recorded_at=view.last_recorded_at,
            replay_of=view.replay_of,
            **state.driver(run_id, view.state.value),
        )

    @app.get("/v1/runs/<run_id>/replay")
    async def replay(run_id: str):
        # A pure fold of the recorded log, executing nothing.
        view = fold(await runtime.log(parse_run_id(run_id)))
        return json_response(view.replay_json())

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
        body = await RESOLVE.read()
        view = await runtime.resolve(run_id, body["output"], state.client_tools)
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

    @app.get("/v1/capabilities")
    async def capabilities():
        server = {"version": __version__}
        if state.commit:
            server["commit"] = state.commit
        # Advertised only when it exists on this server: forks are not built yet.
        return CAPABILITIES.respond(capabilities={"fork": False}, server=server)

    @app.get("/v1/health")
    async def health():
        # Answered from memory, never from the store: it must answer at once
        # while recovery (or a store fault) keeps the store busy.
        return HEALTH.respond(
            status="ok", recovering=state.drivers.recovering, healing=len(state.drivers.healing)
        )

    @app.get("/v1/openapi.json")
    async def openapi():
        return json_response(
            openapi_document(
                tools=runtime.registry.names(),
                process_agents=state.allow_process_agents,
                llm_choices=state.credentials.llm_choices(),
            )
        )

    add_stream_route(app, state)
    add_client_run_routes(app, state)
    return app
