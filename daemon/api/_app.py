"""The control-plane HTTP app (quart-trio): its configuration, its error envelope, its caller
check, and the routes of each resource composed onto it.

Handlers do the fast part (validate, refuse a bad state, record the head or
the resume) and hand driving to the driving set; they never wait for a model
or a tool. Every refusal is the one error envelope and records nothing.

Bodies are the control-plane spec's, field for field. Where we say more, it
is an optional addition a spec-written client never has to send and may
ignore: ``replay_of`` (a re-run) on ``POST /v1/runs`` and in its answer and
on ``GET /v1/runs/{id}``; the ``status``, ``label``, ``agent``, ``graph``, ``limit`` and
``cursor`` query of ``GET /v1/runs`` with its ``next_cursor`` (without them the list is
whole, as the spec has it); ``GET /v1/health``, ``GET /v1/openapi.json``,
``GET /v1/reconciliations`` (the runs parked on an unknown write) and
``not_landed`` on ``POST /v1/runs/{id}/resolve``; YAML graph documents (``application/yaml``)
on ``POST /v1/graphs`` and ``/v1/graphs/validate``; ``GET``/``PUT /v1/settings/edit-mode``
(the flow authoring tools' switch); ``POST``, ``GET`` and ``DELETE /v1/session`` (the page's login,
with its cookie and CSRF token).
``GET /v1/capabilities`` advertises ``fork: true``.

Before any of this, the listener holds every request to the browser rules (``web.Browsers``: a
``Host`` that names the daemon, an ``Origin``, when sent, that is its own or one the operator
listed), with a token or without. Then every ``/v1`` path (routed or not), ``/metrics`` and every
WebSocket handshake under them pass the caller check (``_http.authenticate``: the bearer token or a
live session cookie), except the login itself. Other paths (the page's shell) are left to their
routes: the page (``GET /``, ``GET /ui/<name>``: ``_dashboard_routes``) is served
without auth and is not in the document.
"""

from __future__ import annotations

import logging

from quart import g, request, websocket
from quart_trio import QuartTrio
from salvor.protocol import CodedError, ErrorCode, excerpt
from werkzeug.exceptions import HTTPException

from ..web import OperationRefused, internal
from ._agents_routes import OPERATIONS as AGENTS_OPERATIONS
from ._agents_routes import add_agent_routes
from ._client_run_routes import OPERATIONS as CLIENT_RUN_OPERATIONS
from ._client_run_routes import add_client_run_routes
from ._dashboard_routes import add_dashboard_routes
from ._flow_routes import OPERATIONS as FLOW_OPERATIONS
from ._flow_routes import add_flow_routes
from ._fork_routes import OPERATIONS as FORK_OPERATIONS
from ._fork_routes import add_fork_routes
from ._graph_routes import OPERATIONS as GRAPH_OPERATIONS
from ._graph_routes import add_graph_routes
from ._graph_run_routes import OPERATIONS as GRAPH_RUN_OPERATIONS
from ._graph_run_routes import add_graph_run_routes
from ._http import (
    authenticate,
    authenticate_handshake,
    error_response,
)
from ._meta_routes import OPERATIONS as META_OPERATIONS
from ._meta_routes import add_meta_routes
from ._metrics_routes import OPERATIONS as METRICS_OPERATIONS
from ._metrics_routes import add_metrics_route
from ._model_step_routes import OPERATIONS as MODEL_STEP_OPERATIONS
from ._model_step_routes import add_model_step_routes
from ._openapi import openapi_document
from ._operation import documented, operation_at, operations_of
from ._reconciliation_routes import OPERATIONS as RECONCILIATION_OPERATIONS
from ._reconciliation_routes import add_reconciliation_routes
from ._run_events_routes import OPERATIONS as RUN_EVENTS_OPERATIONS
from ._run_events_routes import add_run_events_route
from ._run_tools_routes import OPERATIONS as RUN_TOOLS_OPERATIONS
from ._run_tools_routes import add_run_tools_routes
from ._run_verb_routes import OPERATIONS as RUN_VERB_OPERATIONS
from ._run_verb_routes import add_run_verb_routes
from ._runs_routes import OPERATIONS as RUNS_OPERATIONS
from ._runs_routes import add_run_routes
from ._session_routes import LOGIN_PATH, add_session_routes
from ._session_routes import OPERATIONS as SESSION_OPERATIONS
from ._settings_routes import OPERATIONS as SETTINGS_OPERATIONS
from ._settings_routes import add_settings_routes
from ._state import ServerState
from ._tool_routes import OPERATIONS as TOOL_OPERATIONS
from ._tool_routes import add_tool_routes
from ._tool_step_routes import OPERATIONS as TOOL_STEP_OPERATIONS
from ._tool_step_routes import add_tool_step_routes
from ._upload_routes import OPERATIONS as UPLOAD_OPERATIONS
from ._upload_routes import add_upload_routes
from ._ws_routes import OPERATIONS as WS_OPERATIONS
from ._ws_routes import add_ws_route

log = logging.getLogger("salvor.api")


# Every route ``create_app`` registers under ``/v1`` and ``/metrics``, as the route modules declare
# them: the document without an app (``_reference``; tests/daemon/api/test_openapi.py holds it to
# the one read from the URL map).
API_OPERATIONS = (
    *AGENTS_OPERATIONS,
    *GRAPH_OPERATIONS,
    *FLOW_OPERATIONS,
    *GRAPH_RUN_OPERATIONS,
    *TOOL_OPERATIONS,
    *UPLOAD_OPERATIONS,
    *FORK_OPERATIONS,
    *RUNS_OPERATIONS,
    *RUN_VERB_OPERATIONS,
    *RUN_TOOLS_OPERATIONS,
    *RECONCILIATION_OPERATIONS,
    *RUN_EVENTS_OPERATIONS,
    *WS_OPERATIONS,
    *META_OPERATIONS,
    *METRICS_OPERATIONS,
    *SETTINGS_OPERATIONS,
    *SESSION_OPERATIONS,
    *CLIENT_RUN_OPERATIONS,
    *MODEL_STEP_OPERATIONS,
    *TOOL_STEP_OPERATIONS,
)


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


def create_app(state: ServerState) -> QuartTrio:
    # No static folder: the page's files are served by its own routes, with its headers.
    app = QuartTrio("salvor", static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = None  # checked by the routes, as the envelope
    app.config["RESPONSE_TIMEOUT"] = None  # streams stay open as long as the run is live
    # Quart hands it to every request as ``request.body_timeout``; ``body_bytes`` applies it to the
    # whole body. (Quart's own use of it covers only get_data() and answers in HTML.)
    app.config["BODY_TIMEOUT"] = state.body_timeout_seconds
    # The cap ``body_bytes`` reads a body under (``salvor serve --max-payload-bytes``).
    app.config["SALVOR_MAX_PAYLOAD_BYTES"] = state.max_payload_bytes
    _admit_callers(app, state)
    app.register_error_handler(CodedError, _coded)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
    _add_routes(app, state)
    # Built now rather than at the first request: a route registered without a declaration, or a
    # declaration that lists a refusal under the wrong status, stops the app from being made.
    openapi_document(operations_of(app))
    return app


def _admit_callers(app: QuartTrio, state: ServerState) -> None:
    """Check every caller of a declared route before its handler runs: the token or session, the
    throttle of wrong tokens, and, for new work, the store's free-space floor. A refused caller
    is answered with the envelope and nothing is read or recorded."""

    @app.before_request
    async def admit_caller() -> None:
        # The API and the metrics (the declared routes) need it; the page's shell does not.
        if not documented(request.path):
            return
        if request.path == LOGIN_PATH and request.method == "POST":
            # The login is how a caller without a session gets one. (A page of another origin
            # cannot log its visitor in: the listener refuses its Origin first.)
            return
        g.session = await authenticate(state.auth_token, state.sessions, state.failed_tries)
        await refuse_new_work_when_low()

    async def refuse_new_work_when_low() -> None:
        # The free-space floor (issue 29, item 5): checked once here for every route declared as
        # new work, after the caller is admitted and before anything is read or recorded.
        if state.floor is None:
            return
        operation = operation_at(app, request.endpoint)
        if operation is not None and operation.new_work:
            await state.floor.check(f"{request.method} {request.path} (new work)")

    @app.before_websocket
    async def admit_handshake() -> None:
        # Raised before the upgrade: the handshake is answered with the error envelope instead.
        if documented(websocket.path):
            g.session = await authenticate_handshake(
                state.auth_token, state.sessions, state.failed_tries
            )


def _add_routes(app: QuartTrio, state: ServerState) -> None:
    """Register every route, in the order the OpenAPI document lists them."""
    add_agent_routes(app, state)
    # Graph documents (issue 15): stored and served.
    add_graph_routes(app, state)
    add_flow_routes(app, state)
    # Graph runs (issue 15): started here, then driven, resumed and watched as every run is.
    add_graph_run_routes(app, state)
    # The tools graph nodes may call, and their file inputs (issue 31).
    add_tool_routes(app, state)
    # Flow members sent ahead of their call (issue 31).
    add_upload_routes(app, state)
    add_fork_routes(app, state)
    add_run_routes(app, state)
    add_run_verb_routes(app, state)
    # Tools attached to a run tree at run time (issue 32, item 5).
    add_run_tools_routes(app, state)
    add_reconciliation_routes(app, state)
    add_run_events_route(app, state)
    # The live WebSocket (issue 17): runs and the run list on one connection.
    add_ws_route(app, state)
    add_meta_routes(app, state)
    # The operator's numbers (issue 17): GET /metrics, behind the same bearer check.
    add_metrics_route(app, state)
    # Operator settings (issue 16): edit mode.
    add_settings_routes(app, state)
    # The page's login (issue 17): the session cookie and its CSRF token.
    add_session_routes(app, state)
    add_client_run_routes(app, state)
    add_model_step_routes(app, state)
    add_tool_step_routes(app, state)
    # The page (issue 17): its files, at / and /ui/<name>.
    add_dashboard_routes(app)


async def _coded(error: CodedError):
    return error_response(error)


async def _http_error(error: HTTPException):
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


async def _unexpected(error: Exception):
    log.exception("unexpected error on %s %s", request.method, request.path)
    return error_response(internal())
