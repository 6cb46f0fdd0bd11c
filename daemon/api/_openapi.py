"""The OpenAPI 3.1 document of the control plane, served at ``GET /v1/openapi.json``.

It describes exactly the routes ``create_app`` registers. What a handler
reads and answers with comes from the declarations it reads and answers
with: the JSON request bodies (``_bodies``), the run list's query
(``_queries``), the fixed-shape answers (``_answers``, and
``client_runs.CLIENT_RUN_ANSWERS`` for a client-driven run's steps), the
shapes the pure core emits (``protocol.WIRE_SCHEMAS``: status, pending,
envelope with each event kind's payload, replay), a run summary's keys
(``store.SUMMARY_KEYS``), and each table of an agent definition checked
against the parser's own field lists (``agents.HTTP_FIELDS``,
``mcp.SERVER_FIELDS``): a mismatch stops the build. Written here: the agent
definitions' field rules, every refusal (the one error envelope, narrowed to
the codes that route can give, each checked against ``CODE_STATUS`` at
import), the event stream's frames and the listings. Shapes that several
routes share are written once under ``components`` and referenced. Built
once, at import; plain data, no IO.

tests/daemon/api/test_openapi.py checks the document against the OpenAPI 3.1
schema and validates real responses of a real daemon against it, so a
handler that drifts from what is written here fails a test.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable

from salvor import __version__
from salvor.protocol import ERROR_STATUS, WIRE_SCHEMAS
from salvor.store import SUMMARY_KEYS, SUMMARY_REQUIRED

from ..agents import DEFAULT_PROVIDER, LlmChoice
from ..client_runs import CLIENT_RUN_ANSWERS
from ..web import CSRF_HEADER, SESSION_COOKIE
from ._agent_schemas import AGENT_SCHEMAS
from ._answers import ANSWERS, DRIVER, DRIVER_RULE
from ._bodies import (
    ABANDON,
    APPEND_EVENTS,
    BODIES,
    CLIENT_MODEL_COMPLETION,
    CLIENT_MODEL_INTENT,
    CLIENT_TOOL_COMPLETION,
    CLIENT_TOOL_INTENT,
    MODEL_STEP,
    OPEN_CLIENT_RUN,
    RESOLVE,
    RESOLVE_RUN,
    RESUME,
    START_GRAPH_RUN,
    START_RUN,
    TOOL_STEP,
    Body,
)
from ._fork_schemas import FORK, FORK_ANSWERS, FORK_SCHEMAS
from ._graph_schemas import GRAPH_ANSWERS, GRAPH_SCHEMAS
from ._queries import RECONCILIATIONS_QUERY, RUNS_QUERY
from ._schema import INSTANT as _INSTANT
from ._schema import JSON
from ._schema import SEQ as _SEQ
from ._schema import closed as _object
from ._schema import exactly as _exactly
from ._schema import ref as _ref
from ._session_schemas import LOGIN, SESSION, SESSION_ANSWERS, SESSION_ENDED, SESSION_SCHEMAS
from ._settings_schemas import EDIT_MODE, SETTINGS_ANSWERS, SETTINGS_SCHEMAS

# An integer in a query or a header is ASCII digits, at most 18 of them (``_http.whole_number``), so
# that no text a caller sends becomes an unbounded int; more digits are a 400.
_WHOLE = {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}
_WHOLE_TEXT = {"type": "string", "pattern": "^[0-9]{1,18}$"}

# -- shared shapes ---------------------------------------------------------------------------------


def _error_schema(codes: list[str] | None = None, details: JSON | None = None) -> JSON:
    """The envelope, its ``code`` narrowed to ``codes`` and its ``details`` to ``details``."""
    if codes is None and details is None:
        return _ref("Error")
    inner: JSON = {"properties": {}}
    if codes is not None:
        inner["properties"]["code"] = {"const": codes[0]} if len(codes) == 1 else {"enum": codes}
    if details is not None:
        inner["properties"]["details"] = details
        inner["required"] = ["details"]
    return {"allOf": [_ref("Error"), {"properties": {"error": inner}}]}


def _run_summary(keys: frozenset[str]) -> JSON:
    """A run in a listing: ``RunSummary.to_json()``'s ``keys`` and the ``driver`` beside them.

    Raises:
        RuntimeError: at import, when ``keys`` are not the ones described here.
    """
    return {
        "description": (
            "A run in a listing. Every field but run, event_count and the instants is absent "
            "(never null) when the run's log cannot be read."
        ),
        **_object(
            _exactly(
                "a run summary (RunSummary.to_json() and its driver)",
                keys | {DRIVER.name},
                {
                    "run": _ref("RunId"),
                    "status": _ref("Status"),
                    "event_count": {"type": "integer", "minimum": 0},
                    "first_recorded_at": _ref("Instant"),
                    "last_recorded_at": _ref("Instant"),
                    "usage": _ref("Usage"),
                    "step_count": {"type": "integer", "minimum": 0},
                    "agent_def_hash": _ref("AgentHash"),
                    "graph_hash": {
                        **_ref("GraphHash"),
                        "description": "A graph run's graph (it has no agent_def_hash).",
                    },
                    "labels": {"allOf": [_ref("Labels")], "minProperties": 1},
                    DRIVER.name: DRIVER.described(),
                },
            ),
            SUMMARY_REQUIRED,
        ),
        **DRIVER_RULE,
    }


SCHEMAS: JSON = {
    "Error": {
        "description": (
            "The one error envelope. `details` is present only with structured evidence."
        ),
        **_object(
            {
                "error": _object(
                    {
                        "code": {"type": "string", "description": "A stable machine token."},
                        "message": {"type": "string", "description": "One human sentence."},
                        "details": {"type": "object"},
                    },
                    ["code", "message"],
                )
            },
            ["error"],
        ),
    },
    "NeedsReconciliationError": _error_schema(
        ["needs_reconciliation"], _object({"intent": _ref("Intent")}, ["intent"])
    ),
    "StillSleepingError": _error_schema(
        ["still_sleeping"],
        _object(
            {"wake_at": _INSTANT, "remaining_seconds": {"type": "integer", "minimum": 0}},
            ["wake_at", "remaining_seconds"],
        ),
    ),
    "AgentHash": {
        "type": "string",
        "pattern": "^sha256:[0-9a-f]{64}$",
        "description": (
            "sha256 over the RFC 8785 canonical JSON of the definition (its `name` excluded)."
        ),
    },
    "GraphHash": {
        "type": "string",
        "pattern": "^sha256:[0-9a-f]{64}$",
        "description": "sha256 over the RFC 8785 canonical JSON of the graph document.",
    },
    # The shapes the pure core emits (status, pending, envelope, ...), from its builders' tables.
    **WIRE_SCHEMAS,
    "RunSummary": _run_summary(SUMMARY_KEYS),
    **AGENT_SCHEMAS,
    # The request bodies and the fixed-shape answers: the handlers' own declarations.
    **{body.name: body.schema() for body in BODIES},
    **{answer.name: answer.schema() for answer in ANSWERS},
    **{answer.name: answer.schema() for answer in CLIENT_RUN_ANSWERS},
    # -- graphs (issue 15): the document, its errors, the answers of /v1/graphs* --
    **GRAPH_SCHEMAS,
    **{answer.name: answer.schema() for answer in GRAPH_ANSWERS},
    "InvalidGraphError": _error_schema(
        ["invalid_graph"],
        _object(
            {"errors": {"type": "array", "minItems": 1, "items": _ref("GraphError")}}, ["errors"]
        ),
    ),
    # -- operator settings (issue 16): /v1/settings/edit-mode --
    **SETTINGS_SCHEMAS,
    **{answer.name: answer.schema() for answer in SETTINGS_ANSWERS},
    # -- the page's login (issue 17): /v1/session --
    **SESSION_SCHEMAS,
    **{answer.name: answer.schema() for answer in SESSION_ANSWERS},
    # -- graph runs' projection and forks (issue 15): /v1/runs/{id}/graph, /fork, /forks --
    **FORK_SCHEMAS,
    **{answer.name: answer.schema() for answer in FORK_ANSWERS},
    "WriteReplayHazardError": _error_schema(
        ["write_replay_hazard"],
        _object(
            {
                "writes": {
                    "type": "array",
                    "minItems": 1,
                    "items": _ref("RecordedWrite"),
                    "description": "Exactly the writes still needing acknowledgement.",
                }
            },
            ["writes"],
        ),
    ),
    "OriginNeedsReconciliationError": _error_schema(
        ["origin_needs_reconciliation"], _object({"intent": _ref("Intent")}, ["intent"])
    ),
    "InvalidForkNodeError": _error_schema(
        ["invalid_fork_node"],
        _object(
            {
                "entered": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The nodes the origin did enter, in walk order.",
                }
            },
            ["entered"],
        ),
    ),
    "StreamFrame": {
        "description": (
            "One frame of the event stream as an SSE client reads it (`event` defaults to "
            "`message`; `id` carries over to the frames after it). An event is `id: <seq>` and "
            "`data: <Envelope>` with no `event:` line; the last frame is `event: end` with "
            "`data: <EndFrame>` and no `id:` line of its own."
        ),
        "oneOf": [
            _object(
                {
                    "event": {"const": "message"},
                    "id": {"type": "string", "pattern": "^(0|[1-9][0-9]*)$"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": _ref("Envelope"),
                    },
                },
                ["event", "id", "data"],
            ),
            _object(
                {
                    "event": {"const": "end"},
                    "id": {"type": "string", "pattern": "^(0|[1-9][0-9]*)$"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": _ref("EndFrame"),
                    },
                },
                ["event", "data"],
            ),
        ],
    },
}

# -- parameters and refusals -----------------------------------------------------------------------

PARAMETERS: JSON = {
    "Csrf": {
        "name": CSRF_HEADER,
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": (
            "The session's csrf token (as `POST` or `GET /v1/session` answered it). Required on "
            "a state-changing request the session cookie authenticates; a bearer request needs "
            "none."
        ),
    },
    "DriveToken": {
        "name": "X-Drive-Token",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "The run's drive token (its lease), as `POST /v1/client-runs` answered it.",
    },
    "RunId": {
        "name": "run_id",
        "in": "path",
        "required": True,
        "schema": _ref("RunId"),
        "description": "A run id; anything that is not a UUID is a 400.",
    },
    "AgentHash": {
        "name": "agent_hash",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": "An agent hash as `POST /v1/agents` returned it.",
    },
    "GraphHash": {
        "name": "graph_hash",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": "A graph hash as `POST /v1/graphs` returned it; any other text is a 404.",
    },
}


# -- the error-code table --------------------------------------------------------------------------
# The one table of codes and their statuses (``salvor.protocol.ErrorCode``): every refusal this
# document lists is checked against it at import (``_check_codes``), so a route documented under a
# status its code does not answer with fails every test.
CODE_STATUS = ERROR_STATUS


def _error(description: str, *codes: str, schema: JSON | None = None) -> JSON:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema or _error_schema(list(codes) or None)}},
    }


_FORBIDDEN_WHY = (
    "a request the session cookie authenticates from a page of another origin (an `Origin` that "
    f"is not the daemon's own), or one that changes state without the session's `{CSRF_HEADER}`. "
    "Nothing changed; a bearer request never gets it."
)

RESPONSES: JSON = {
    "BadRequest": _error(
        "Malformed body or parameter, a bad run id, or an input a recorded schema rejects "
        "(`details.violations`). Nothing recorded.",
        "bad_request",
    ),
    "Unauthorized": _error(
        "The server has a token and the request's bearer token is missing or wrong.", "unauthorized"
    ),
    "UnknownRun": _error("No run under that id.", "unknown_run"),
    "PayloadTooLarge": _error("The body is over 8 MiB.", "payload_too_large"),
    "RequestTimeout": _error(
        "The body did not arrive whole in time (60 s by default); nothing recorded, "
        "and the connection closes.",
        "request_timeout",
    ),
    "Internal": _error("An unexpected failure; the daemon's log has the rest.", "internal"),
    # What a session-cookie caller hears (``web.admit``); added to every guarded operation by
    # ``_add_forbidden``.
    "Forbidden": _error(f"With --auth-token: {_FORBIDDEN_WHY}", "forbidden"),
    # No operation answers these two: they are what a path or method outside `paths` gets.
    "NoRoute": _error("No route at that path (any method).", "not_found"),
    "MethodNotAllowed": {
        **_error("The path exists, the method does not.", "method_not_allowed"),
        "headers": {
            "Allow": {"description": "The methods the path answers.", "schema": {"type": "string"}}
        },
    },
}


def _responses(ok: dict[str, JSON], *refusals: str, extra: dict[str, JSON] | None = None) -> JSON:
    """``ok``: status -> (description, JSON schema); the named shared refusals (a route that reads a
    body, and so names PayloadTooLarge, can also time out reading it: 408); ``extra`` responses as
    they are; and 401 and 500, which every route can give."""
    responses: JSON = {}
    for status, (description, schema) in ok.items():
        responses[status] = {
            "description": description,
            "content": {"application/json": {"schema": schema}},
        }
    if "PayloadTooLarge" in refusals:
        refusals = (*refusals, "RequestTimeout")
    for status, name in (
        ("400", "BadRequest"),
        ("404", "UnknownRun"),
        ("408", "RequestTimeout"),
        ("413", "PayloadTooLarge"),
    ):
        if name in refusals:
            responses[status] = {"$ref": f"#/components/responses/{name}"}
    responses.update(extra or {})
    responses.setdefault("401", {"$ref": "#/components/responses/Unauthorized"})
    responses["500"] = {"$ref": "#/components/responses/Internal"}
    return dict(sorted(responses.items()))


def _body(body: Body) -> JSON:
    return {
        "required": not body.optional,
        "content": {"application/json": {"schema": _ref(body.name)}},
    }


_RUN = [{"$ref": "#/components/parameters/RunId"}]
_DRIVE_TOKEN = {"$ref": "#/components/parameters/DriveToken"}
_DRIVE_MISSING = _error(
    "No drive token, or (with --auth-token) no bearer token.",
    schema=_error_schema(["missing_drive_token", "unauthorized"]),
)
_DRIVE_FORBIDDEN = _error("The drive token is not the run's current lease.", "invalid_drive_token")
_CONFLICT_OTHER = _error_schema(["client_driven_run", "divergence"])

# -- graphs (issue 15): documents stored and served ------------------------------------------------

# A YAML body is described by the JSON value it parses to: YAML is another spelling of the same
# document, read with JSON's values only (no timestamps, sets, binary, non-string or duplicate
# keys), and it hashes as that JSON does.
_GRAPH_BODY = {
    "required": True,
    "content": {
        media: {"schema": _ref("GraphDocument")}
        for media in ("application/json", "application/yaml", "text/yaml")
    },
}
# validate answers whatever it is sent, an empty body too (`valid: false`).
_ANY_DOCUMENT = {
    "schema": {
        "description": "Any value: whatever it is, the answer says whether it is a valid graph "
        "document."
    }
}
_NOT_A_DOCUMENT_TYPE = _error_schema(["bad_request"])
GRAPH_PATHS: JSON = {
    "/v1/graphs": {
        "post": {
            "operationId": "submitGraph",
            "summary": "Submit a graph document: validated whole, stored content-addressed",
            "requestBody": _GRAPH_BODY,
            "responses": _responses(
                {
                    "201": (
                        "Stored; `created` is false when the identical document already was.",
                        _ref("GraphCreated"),
                    )
                },
                "PayloadTooLarge",
                extra={
                    "400": _error(
                        "`invalid_graph` with every error in `details.errors` (a body that is "
                        "not a document at all is one `malformed_document`), or `bad_request` "
                        "for a media type that is neither JSON nor YAML. Nothing stored.",
                        schema={"oneOf": [_ref("InvalidGraphError"), _NOT_A_DOCUMENT_TYPE]},
                    )
                },
            ),
        },
        "get": {
            "operationId": "listGraphs",
            "summary": "List the stored graphs with their shape, oldest first",
            "responses": _responses({"200": ("The graphs.", _ref("GraphList"))}),
        },
    },
    "/v1/graphs/validate": {
        "post": {
            "operationId": "validateGraph",
            "summary": "Validate a graph document without storing it",
            "requestBody": {
                "required": False,
                "content": {
                    media: _ANY_DOCUMENT
                    for media in ("application/json", "application/yaml", "text/yaml")
                },
            },
            "responses": _responses(
                {
                    "200": (
                        "The answer, valid or not (with every error); nothing is stored.",
                        {"oneOf": [_ref("GraphValid"), _ref("GraphInvalid")]},
                    )
                },
                "PayloadTooLarge",
                extra={
                    "400": _error(
                        "A media type that is neither JSON nor YAML.",
                        schema=_NOT_A_DOCUMENT_TYPE,
                    )
                },
            ),
        },
    },
    "/v1/graphs/{graph_hash}": {
        "get": {
            "operationId": "getGraph",
            "summary": "Read one stored graph document back, as submitted",
            "parameters": [{"$ref": "#/components/parameters/GraphHash"}],
            "responses": _responses(
                {"200": ("The document.", _ref("Graph"))},
                extra={"404": _error("No graph stored under that hash.", "unknown_graph")},
            ),
        },
    },
}

# -- graph runs (issue 15): a stored graph started as a run ----------------------------------------

GRAPH_RUN_PATHS: JSON = {
    "/v1/graph-runs": {
        "post": {
            "operationId": "startGraphRun",
            "summary": (
                "Start a run of a stored graph; answered once its head event is durable, "
                "then walked in the background"
            ),
            "description": (
                "Every agent and tool the graph's nodes name is resolved first, so a run is "
                "started only when all of it resolves. Its events, status, stream, resume and "
                "abandon are an ordinary run's (a gate parks it as `suspended`)."
            ),
            "requestBody": _body(START_GRAPH_RUN),
            "responses": _responses(
                {"201": ("The run exists; watch it on its event stream.", _ref("RunStarted"))},
                "PayloadTooLarge",
                extra={
                    "400": _error(
                        "Malformed body or labels over the bounds, or a node naming a process "
                        "or service agent (`details.node`; agent nodes run built-in agents). "
                        "Nothing recorded.",
                        "bad_request",
                    ),
                    "404": _error(
                        "No graph stored under `graph_hash` (`unknown_graph`), or a node names "
                        "an agent that is not registered or a tool this daemon lacks "
                        "(`unknown_agent` / `unknown_tool`, `details.node`). Nothing recorded.",
                        "unknown_graph",
                        "unknown_agent",
                        "unknown_tool",
                    ),
                },
            ),
        },
    },
}

# -- graph runs' projection and forks (issue 15) ---------------------------------------------------

_NOT_A_GRAPH_RUN = _error_schema(["not_a_graph_run"])
FORK_PATHS: JSON = {
    "/v1/runs/{run_id}/graph": {
        "get": {
            "operationId": "getRunGraph",
            "summary": "A graph run's per-node projection: the nodes its walk reached, and how",
            "description": (
                "Read from the run's log. A node not reached is absent (not `skipped`); "
                "`current_node` only while a node is entered and not exited; `branch_case`, "
                "`map` and `forked_from` only when recorded."
            ),
            "parameters": _RUN,
            "responses": _responses(
                {"200": ("The projection.", _ref("RunGraph"))},
                "BadRequest",
                "UnknownRun",
                extra={
                    "409": _error(
                        "The run is an agent run (its log opens with RunStarted).",
                        schema=_NOT_A_GRAPH_RUN,
                    )
                },
            ),
        },
    },
    "/v1/runs/{run_id}/fork": {
        "post": {
            "operationId": "forkRun",
            "summary": (
                "Fork a graph run from a node into a new run, refusing to re-fire a recorded "
                "write nobody acknowledged"
            ),
            "description": (
                "The child's log is the origin's below the fork node's entry, under the child's "
                "own head (`forked_from`), written in one append; the origin is untouched. The "
                "child is then driven from the fork node like a recovered graph run. Every "
                "refusal applies under `dry_run` too, and records nothing."
            ),
            "parameters": _RUN,
            "requestBody": _body(FORK),
            "responses": _responses(
                {
                    "200": ("`dry_run`: the plan; nothing was created.", _ref("ForkPlan")),
                    "201": ("The child exists durably and is driving.", _ref("ForkCreated")),
                },
                "BadRequest",
                "PayloadTooLarge",
                extra={
                    "404": _error(
                        "No run under that id, or the origin's graph is no longer stored.",
                        "unknown_run",
                        "unknown_graph",
                    ),
                    "409": _error(
                        "write_replay_hazard (`details.writes`), origin_needs_reconciliation "
                        "(`details.intent`), invalid_fork_node (`details.entered`), or "
                        "not_a_graph_run. Nothing recorded.",
                        schema={
                            "oneOf": [
                                _ref("WriteReplayHazardError"),
                                _ref("OriginNeedsReconciliationError"),
                                _ref("InvalidForkNodeError"),
                                _NOT_A_GRAPH_RUN,
                            ]
                        },
                    ),
                },
            ),
        },
    },
    "/v1/runs/{run_id}/forks": {
        "get": {
            "operationId": "listRunForks",
            "summary": "The runs forked from a run, oldest first: a derived index",
            "parameters": _RUN,
            "responses": _responses(
                {"200": ("The forks.", _ref("ForkList"))}, "BadRequest", "UnknownRun"
            ),
        },
    },
}

# -- operator settings (issue 16) ------------------------------------------------------------------

SETTINGS_PATHS: JSON = {
    "/v1/settings/edit-mode": {
        "get": {
            "operationId": "getEditMode",
            "summary": "Whether the flow authoring tools are offered (edit mode); off by default",
            "responses": _responses(
                {"200": ("Edit mode, as the store holds it.", _ref("EditMode"))}
            ),
        },
        "put": {
            "operationId": "setEditMode",
            "summary": "Turn edit mode on or off for every run of the store",
            "description": (
                "Kept in the store, so every daemon on it and `salvor edit-mode` see the same "
                "value. A live run of an agent that opted into an authoring tool sees the change "
                "at its next model call, without a restart."
            ),
            "requestBody": _body(EDIT_MODE),
            "responses": _responses(
                {"200": ("The setting now.", _ref("EditMode"))},
                "BadRequest",
                "PayloadTooLarge",
            ),
        },
    },
}

# -- the page's login (issue 17) ------------------------------------------------------------------

_FOREIGN_LOGIN = _error(
    "Sent from a page of another origin (an `Origin` that is not the daemon's own). No session, "
    "no cookie.",
    "forbidden",
)
_NO_SESSION = _error(
    "The daemon has a token and the request carries neither the bearer token nor a live session "
    "cookie (none, ended, or expired).",
    "unauthorized",
)
_CSRF = {"$ref": "#/components/parameters/Csrf"}

SESSION_PATHS: JSON = {
    "/v1/session": {
        "post": {
            "operationId": "logIn",
            "summary": "Log in with the daemon's token: a session cookie and its csrf token",
            "description": (
                f"The token goes in the body, never in the URL (any query string is a 400). The "
                f"answer sets `{SESSION_COOKIE}` (HttpOnly, SameSite=Strict, Path=/, Max-Age of "
                "12 hours, Secure over TLS); a session cookie the request still carried is ended. "
                "Sessions live in the daemon's memory (a restart ends them), at most 1,024 (a "
                "login past that ends the oldest). Needs no authentication, but an `Origin`, if "
                "sent, must be the daemon's own. Without --auth-token there is no session: any "
                "token answers nulls and no cookie."
            ),
            "security": [{}],
            "requestBody": _body(LOGIN),
            "responses": _responses(
                {"200": ("The session (and `Set-Cookie`).", _ref(SESSION.name))},
                "BadRequest",
                "PayloadTooLarge",
                extra={
                    "401": _error(
                        "That is not the daemon's token. No session, no cookie.", "unauthorized"
                    ),
                    "403": _FOREIGN_LOGIN,
                },
            ),
        },
        "get": {
            "operationId": "getSession",
            "summary": "The session the cookie names, so a reloaded page gets its csrf token back",
            "description": (
                "A bearer caller (or any caller of a daemon without --auth-token) needs no "
                "session: it is answered nulls."
            ),
            "responses": _responses(
                {"200": ("The session.", _ref(SESSION.name))}, extra={"401": _NO_SESSION}
            ),
        },
        "delete": {
            "operationId": "logOut",
            "summary": "End the session the cookie names, and clear the cookie",
            "parameters": [_CSRF],
            "responses": _responses(
                {"200": ("Whether a session was ended.", _ref(SESSION_ENDED.name))},
                extra={"401": _NO_SESSION},
            ),
        },
    },
}

PATHS: JSON = {
    "/v1/agents": {
        "post": {
            "operationId": "registerAgent",
            "summary": "Register an agent definition (validated, stored, content-addressed)",
            "description": (
                "The agent is built first: each MCP server it declares is started or reached, "
                "lists its tools and is closed again. A definition that will not build is a 400 "
                "naming the server and why, and nothing is stored."
            ),
            "requestBody": {
                "required": True,
                "content": {
                    "application/toml": {"schema": {"type": "string"}},
                    "application/json": {"schema": _ref("AgentDefinition")},
                    "text/markdown": {
                        "schema": {
                            "type": "string",
                            "description": (
                                "A markdown agent file: YAML front matter between `---` lines "
                                "(`name`, `model`, `description`, `tools` — flow tools and "
                                "registry tools alike —, `inputs`, `outputs`, and the built-in "
                                "agent's `llm`, `budgets`, `pricing`, `max_response_tokens`, "
                                "`record_prompts`, `mcp_servers`; `card` and `architect` are "
                                "display metadata), the body its system prompt. It hashes as "
                                "the TOML definition of the same fields."
                            ),
                        }
                    },
                },
            },
            "responses": _responses(
                {
                    "201": (
                        "Registered; `created` is false when it already was.",
                        _ref("AgentCreated"),
                    )
                },
                "BadRequest",
                "PayloadTooLarge",
            ),
        },
        "get": {
            "operationId": "listAgents",
            "summary": "List the registered agents",
            "responses": _responses(
                {"200": ("The agents; `name` only when the definition has one.", _ref("AgentList"))}
            ),
        },
    },
    "/v1/agents/{agent_hash}": {
        "get": {
            "operationId": "getAgent",
            "summary": "Read one registered definition back",
            "parameters": [{"$ref": "#/components/parameters/AgentHash"}],
            "responses": _responses(
                {"200": ("The definition, verbatim.", _ref("Agent"))},
                extra={"404": _error("No agent under that hash.", "unknown_agent")},
            ),
        },
    },
    **GRAPH_PATHS,
    **GRAPH_RUN_PATHS,
    "/v1/runs": {
        "post": {
            "operationId": "startRun",
            "summary": (
                "Start a run; answered once its head event is durable, "
                "then driven in the background"
            ),
            "requestBody": _body(START_RUN),
            "responses": _responses(
                {"201": ("The run exists; watch it on its event stream.", _ref("RunStarted"))},
                "BadRequest",
                "PayloadTooLarge",
                extra={
                    "404": _error(
                        "The agent is not registered, or the run "
                        "named by replay_of does not exist.",
                        "unknown_agent",
                        "unknown_run",
                    ),
                    "409": _error(
                        "The chosen run_id already has history (`run_exists`), the run named by "
                        "replay_of has not completed (`wrong_state`), or the agent is a service "
                        "whose proxy port another live run of this daemon holds (`port_held`; "
                        "`details.port` and `details.run` name them). Nothing recorded.",
                        "run_exists",
                        "wrong_state",
                        "port_held",
                    ),
                },
            ),
        },
        "get": {
            "operationId": "listRuns",
            "summary": "List runs, newest first, with their folded status",
            "parameters": RUNS_QUERY.described(),
            "responses": _responses({"200": ("One page of runs.", _ref("RunList"))}, "BadRequest"),
        },
    },
    "/v1/runs/{run_id}": {
        "get": {
            "operationId": "getRun",
            "summary": "One run's derived state",
            "parameters": _RUN,
            "responses": _responses({"200": ("The run.", _ref("Run"))}, "BadRequest", "UnknownRun"),
        },
    },
    "/v1/runs/{run_id}/children": {
        "get": {
            "operationId": "listRunChildren",
            "summary": (
                "An extension: the child runs a run's subagent calls started, oldest first "
                "(a derived index, as `GET /v1/runs?label=salvor.parent:{run_id}` lists them)"
            ),
            "parameters": _RUN,
            "responses": _responses(
                {"200": ("The children.", _ref("ChildList"))}, "BadRequest", "UnknownRun"
            ),
        },
    },
    "/v1/runs/{run_id}/replay": {
        "get": {
            "operationId": "replayRun",
            "summary": "Dry-run replay: the state folded from the log, executing nothing",
            "parameters": _RUN,
            "responses": _responses(
                {"200": ("The projection.", _ref("Replay"))}, "BadRequest", "UnknownRun"
            ),
        },
    },
    "/v1/runs/{run_id}/events": {
        "get": {
            "operationId": "streamRunEvents",
            "summary": (
                "The run's events as server-sent events: replay from the cursor, then the live tail"
            ),
            "description": (
                "Each recorded event is one frame, `id: <seq>` and `data: <Envelope>`, with no "
                "`event:` field. When the run rests, one frame `event: end` with `data: "
                "<EndFrame>` closes the stream; `detached: true` when no driver here is running "
                "the run. Lines starting with `:` are keep-alive comments. `Last-Event-ID` (wins) "
                "or `from_seq` set the cursor; with neither the stream starts at seq 0."
            ),
            "parameters": [
                *_RUN,
                {"name": "from_seq", "in": "query", "schema": _WHOLE},
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "schema": _WHOLE_TEXT,
                    "description": (
                        "The last seq this client received; the stream resumes after it."
                    ),
                },
            ],
            "responses": _responses(
                {},
                "BadRequest",
                "UnknownRun",
                extra={
                    "200": {
                        "description": "The stream.",
                        "content": {
                            "text/event-stream": {
                                "schema": _ref("StreamFrame"),
                                "x-frame-schemas": {
                                    "message": _ref("Envelope"),
                                    "end": _ref("EndFrame"),
                                },
                            }
                        },
                    }
                },
            ),
        },
    },
    "/v1/ws": {
        "get": {
            "operationId": "liveWebSocket",
            "summary": "One WebSocket carrying any number of runs' events and the run list",
            "description": (
                "Upgrades to a WebSocket (salvor's own protocol; text frames, one JSON object "
                "each). Requests: `subscribe` (`run`, `from_seq`), `unsubscribe` (`run`), "
                "`watch_runs`, `unwatch_runs`. Messages: `event` (the Envelope, as the stream "
                "sends it), `status`, `run` (a run-list entry) and `error` (the error envelope's "
                "body). Closes 1013 when its outgoing buffer is full, 1001 when the daemon stops, "
                "1008 for a message that is not a JSON object or exceeds 64 KiB."
            ),
            "responses": _responses(
                {},
                extra={
                    "101": {"description": "Switching to the WebSocket protocol."},
                    "400": _error(
                        "A plain HTTP request, not a WebSocket handshake (`bad_request`).",
                        "bad_request",
                    ),
                },
            ),
        },
    },
    "/v1/runs/{run_id}/resume": {
        "post": {
            "operationId": "resumeRun",
            "summary": "Continue a run: a parked one with an input, an interrupted one without",
            "parameters": _RUN,
            "requestBody": _body(RESUME),
            "responses": _responses(
                {
                    "200": ("The run had already finished; left alone.", _ref("ResumeFinished")),
                    "202": (
                        "The run is driving again; open its stream to watch.",
                        _ref("ResumeDriving"),
                    ),
                },
                "UnknownRun",
                "PayloadTooLarge",
                extra={
                    "400": _error(
                        "Malformed body, a bad run id, or an input the run's recorded schema "
                        "rejects (`bad_request`, `details.violations`); a graph run parked at a "
                        "gate answers an approval its `approval_schema` rejects with "
                        "`approval_schema_violation` (`details.node`, `details.violations`). "
                        "Nothing recorded.",
                        "bad_request",
                        "approval_schema_violation",
                    ),
                    "404": _error(
                        "No run under that id, or its agent (or graph) is not registered here.",
                        "unknown_run",
                        "unknown_agent",
                        "unknown_graph",
                    ),
                    "409": _error(
                        "needs_reconciliation (`details.intent`: the dangling write), "
                        "still_sleeping (`details.wake_at`, `details.remaining_seconds`), or "
                        "client_driven_run. Nothing recorded.",
                        schema={
                            "oneOf": [
                                _ref("NeedsReconciliationError"),
                                _ref("StillSleepingError"),
                                _CONFLICT_OTHER,
                            ]
                        },
                    ),
                },
            ),
        },
    },
    "/v1/runs/{run_id}/resolve": {
        "post": {
            "operationId": "resolveRun",
            "summary": (
                "Record by hand what a dangling write returned, or that it did not land "
                "(settled_by: operator); drives nothing"
            ),
            "description": (
                "`output`: the write happened and returned it (a client's write is checked "
                "against its declaration). `not_landed: true`: it did not happen; it is recorded "
                "as a failed call, its idempotency identity is given up, and the next call with "
                "it performs the write afresh under the same key. Exactly one of the two."
            ),
            "parameters": _RUN,
            "requestBody": _body(RESOLVE_RUN),
            "responses": _responses(
                {"200": ("Recorded; resume the run to continue it.", _ref("Resolved"))},
                "BadRequest",
                "UnknownRun",
                "PayloadTooLarge",
                extra={
                    "409": _error("The run has no dangling write.", "wrong_state", "divergence")
                },
            ),
        },
    },
    "/v1/reconciliations": {
        "get": {
            "operationId": "listReconciliations",
            "summary": (
                "The runs parked on a write of unknown outcome, oldest write first, with what "
                "resolving each expects"
            ),
            "description": (
                "Ordered by when the write's intent was recorded, then run id. A read: nothing "
                "is driven or recorded."
            ),
            "parameters": RECONCILIATIONS_QUERY.described(),
            "responses": _responses(
                {"200": ("One page of the queue.", _ref("ReconciliationList"))}, "BadRequest"
            ),
        },
    },
    "/v1/runs/{run_id}/abandon": {
        "post": {
            "operationId": "abandonRun",
            "summary": "Retire an unfinished run with a terminal RunAbandoned",
            "parameters": _RUN,
            "requestBody": _body(ABANDON),
            "responses": _responses(
                {
                    "200": (
                        (
                            "Abandoned; an abandoned dangling write is "
                            "named in `status.unresolved_write`."
                        ),
                        _ref("Abandoned"),
                    )
                },
                "BadRequest",
                "UnknownRun",
                "PayloadTooLarge",
                extra={"409": _error("The run is already terminal.", "wrong_state", "divergence")},
            ),
        },
    },
    "/v1/client-tools": {
        "get": {
            "operationId": "listClientTools",
            "summary": (
                "The client-performed tools the operator declared (salvor serve --client-tool)"
            ),
            "responses": _responses(
                {"200": ("The declarations; absent fields are omitted.", _ref("ClientTools"))}
            ),
        },
    },
    "/v1/client-runs": {
        "post": {
            "operationId": "openClientRun",
            "summary": (
                "Open a client-driven run (201), or re-open one: its holder keeps its token, an "
                "unheld or adopted run gets a fresh lease (200)"
            ),
            "parameters": [_DRIVE_TOKEN],
            "requestBody": _body(OPEN_CLIENT_RUN),
            "responses": _responses(
                {
                    "201": (
                        "A fresh run: append its RunStarted at seq 0.",
                        _ref("ClientRunOpened"),
                    ),
                    "200": ("A re-opened run with its recorded log.", _ref("ClientRunOpened")),
                },
                "BadRequest",
                "PayloadTooLarge",
                extra={
                    "409": _error(
                        "Another driver's lease is current (`details.lapses_in_seconds`), or the "
                        "id is a server-driven run.",
                        schema=_error_schema(["lease_held", "run_exists"]),
                    )
                },
            ),
        },
    },
    "/v1/client-runs/{run_id}/release": {
        "post": {
            "operationId": "releaseClientRun",
            "summary": (
                "Hand the lease back (idempotent: `released` is false when nothing was held)"
            ),
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "responses": _responses(
                {"200": ("Released, or nothing to release.", _ref("Released"))},
                "BadRequest",
                extra={"403": _DRIVE_FORBIDDEN},
            ),
        },
    },
    "/v1/client-runs/{run_id}/heartbeat": {
        "post": {
            "operationId": "heartbeatClientRun",
            "summary": "Refresh the lease without driving (for a driver inside a long body)",
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "responses": _responses(
                {"200": ("The lease's whole TTL as of this beat.", _ref("LeaseLapse"))},
                "BadRequest",
                "UnknownRun",
                extra={"401": _DRIVE_MISSING, "403": _DRIVE_FORBIDDEN},
            ),
        },
    },
    "/v1/client-runs/{run_id}/log": {
        "get": {
            "operationId": "getClientRunLog",
            "summary": (
                "A client-driven run's recorded envelopes (`from_seq` "
                "for the tail); no token needed"
            ),
            "parameters": [*_RUN, {"name": "from_seq", "in": "query", "schema": _WHOLE}],
            "responses": _responses(
                {"200": ("The envelopes.", _ref("ClientLog"))}, "BadRequest", "UnknownRun"
            ),
        },
    },
    "/v1/client-runs/{run_id}/model-step": {
        "post": {
            "operationId": "clientRunModelStep",
            "summary": (
                "The daemon performs the model call at `seq` (intent first); a retry of a "
                "completed step answers from the log, a dangling one is issued again"
            ),
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "requestBody": _body(MODEL_STEP),
            "responses": _responses(
                {
                    "200": (
                        "The completion (performed now, or recorded before).",
                        _ref("ModelStepDone"),
                    )
                },
                "BadRequest",
                "UnknownRun",
                "PayloadTooLarge",
                extra={
                    "401": _DRIVE_MISSING,
                    "403": _DRIVE_FORBIDDEN,
                    "409": _error(
                        "Another event or request at `seq`, or `seq` beyond the log.", "divergence"
                    ),
                    "502": _error(
                        "The provider failed; the intent stays open and the same step retries it.",
                        "model_execution",
                    ),
                    "503": _error(
                        "No model is configured; nothing recorded.", "model_executor_unavailable"
                    ),
                },
            ),
        },
    },
    "/v1/client-runs/{run_id}/tool-step": {
        "post": {
            "operationId": "clientRunToolStep",
            "summary": (
                "The daemon performs the registry tool call at `seq` with the registered effect; "
                "retries follow the effect table"
            ),
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "requestBody": _body(TOOL_STEP),
            "responses": _responses(
                {
                    "200": (
                        "The tool's output (performed now, or recorded before).",
                        _ref("ToolStepDone"),
                    )
                },
                "BadRequest",
                "PayloadTooLarge",
                extra={
                    "401": _DRIVE_MISSING,
                    "403": _DRIVE_FORBIDDEN,
                    "404": _error(
                        "No such client-driven run, or no such tool.", "unknown_run", "unknown_tool"
                    ),
                    "409": _error(
                        "Another call at `seq`, or a dangling write (`details.intent`).",
                        "divergence",
                        "needs_reconciliation",
                    ),
                    "502": _error("Every attempt failed; the intent stays open.", "tool_execution"),
                },
            ),
        },
    },
    "/v1/client-runs/{run_id}/client-tool-intent": {
        "post": {
            "operationId": "clientToolIntent",
            "summary": (
                "Open a call the client performs itself: recorded "
                "write-ahead, its key derived by the daemon"
            ),
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "requestBody": _body(CLIENT_TOOL_INTENT),
            "responses": _responses(
                {
                    "200": (
                        (
                            "Open (`settled` false) or already completed "
                            "(`settled` true, with `output`)."
                        ),
                        _ref("ClientToolOpened"),
                    )
                },
                "BadRequest",
                "PayloadTooLarge",
                extra={
                    "401": _DRIVE_MISSING,
                    "403": _DRIVE_FORBIDDEN,
                    "404": _error(
                        "No such client-driven run, or no such declared tool.",
                        "unknown_run",
                        "unknown_tool",
                    ),
                    "409": _error(
                        "Another event at `seq`, `seq` beyond the log, or the "
                        "declared key held by an open call.",
                        "divergence",
                    ),
                },
            ),
        },
    },
    "/v1/client-runs/{run_id}/client-tool-completion": {
        "post": {
            "operationId": "clientToolCompletion",
            "summary": (
                "Record what the client's own call returned, or how it failed, once the "
                "declaration allows and accepts it"
            ),
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "requestBody": _body(CLIENT_TOOL_COMPLETION),
            "responses": _responses(
                {"200": ("Recorded.", _ref("Completed"))},
                "BadRequest",
                "UnknownRun",
                "PayloadTooLarge",
                extra={
                    "401": _DRIVE_MISSING,
                    "403": _error(
                        "A bad drive token, or a completion the declaration "
                        "does not let the client record.",
                        "invalid_drive_token",
                        "client_completion_refused",
                    ),
                    "409": _error("The log does not end at a tool intent at `seq`.", "divergence"),
                },
            ),
        },
    },
    "/v1/client-runs/{run_id}/client-model-intent": {
        "post": {
            "operationId": "clientModelIntent",
            "summary": (
                "Open a model call the client makes with its own key "
                "(the hash is the client's claim)"
            ),
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "requestBody": _body(CLIENT_MODEL_INTENT),
            "responses": _responses(
                {
                    "200": (
                        "Open, or already completed (with `response` and `usage`).",
                        _ref("ClientModelOpened"),
                    )
                },
                "BadRequest",
                "UnknownRun",
                "PayloadTooLarge",
                extra={
                    "401": _DRIVE_MISSING,
                    "403": _DRIVE_FORBIDDEN,
                    "409": _error(
                        "Another request or a salvor-performed call at "
                        "`seq`, or `seq` beyond the log.",
                        "divergence",
                    ),
                },
            ),
        },
    },
    "/v1/client-runs/{run_id}/client-model-completion": {
        "post": {
            "operationId": "clientModelCompletion",
            "summary": "Record what the client's own model call returned (usage required)",
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "requestBody": _body(CLIENT_MODEL_COMPLETION),
            "responses": _responses(
                {"200": ("Recorded.", _ref("Completed"))},
                "BadRequest",
                "UnknownRun",
                "PayloadTooLarge",
                extra={
                    "401": _DRIVE_MISSING,
                    "403": _error(
                        "A bad drive token, or a call salvor performed.",
                        "invalid_drive_token",
                        "client_completion_refused",
                    ),
                    "409": _error("The log does not end at a model intent at `seq`.", "divergence"),
                },
            ),
        },
    },
    "/v1/client-runs/{run_id}/resolve": {
        "post": {
            "operationId": "clientResolve",
            "summary": (
                "The driver records what its dangling write did (checked against the "
                "declaration); it keeps its lease"
            ),
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "requestBody": _body(RESOLVE),
            "responses": _responses(
                {"200": ("Recorded; the run is drivable again.", _ref("ClientResolved"))},
                "BadRequest",
                "UnknownRun",
                "PayloadTooLarge",
                extra={
                    "401": _DRIVE_MISSING,
                    "403": _DRIVE_FORBIDDEN,
                    "409": _error("No dangling write to resolve.", "wrong_state", "divergence"),
                },
            ),
        },
    },
    "/v1/client-runs/{run_id}/events": {
        "post": {
            "operationId": "appendClientRunEvents",
            "summary": (
                "The guarded append: control and context events the client's cursor produced, "
                "checked whole before anything is written"
            ),
            "parameters": [*_RUN, _DRIVE_TOKEN],
            "requestBody": _body(APPEND_EVENTS),
            "responses": _responses(
                {
                    "200": (
                        "Appended (a byte-identical retry is reported and changes nothing).",
                        _ref("Appended"),
                    )
                },
                "BadRequest",
                "UnknownRun",
                "PayloadTooLarge",
                extra={
                    "401": _DRIVE_MISSING,
                    "403": _DRIVE_FORBIDDEN,
                    "409": _error(
                        "Not the legal next event, or other bytes at a recorded seq.", "divergence"
                    ),
                    "422": _error(
                        "A model or tool event: those have endpoints of their own.",
                        "unsupported_event_kind",
                    ),
                },
            ),
        },
    },
    "/v1/capabilities": {
        "get": {
            "operationId": "getCapabilities",
            "summary": "What this server can do, and which build it is",
            "responses": _responses(
                {"200": ("Capabilities and the server's build.", _ref("Capabilities"))}
            ),
        },
    },
    "/v1/health": {
        "get": {
            "operationId": "getHealth",
            "summary": (
                "Whether the daemon answers, and how many runs it is still recovering or healing"
            ),
            "responses": _responses(
                {
                    "200": (
                        "The daemon answers (from memory: it never reads the store).",
                        _ref("Health"),
                    )
                }
            ),
        },
    },
    "/metrics": {
        "get": {
            "operationId": "getMetrics",
            "summary": "The daemon's numbers in the Prometheus text format",
            "description": (
                "Runs by state, appends and commits, events per group commit, commit latency, "
                "drivers live, stream subscribers, proxy and MCP call latency, claims held, "
                "reconciliations open. Behind the same auth as the `/v1` routes; the runs by "
                "state are read from the store at each scrape."
            ),
            "responses": {
                "200": {
                    "description": "The exposition (`prometheus_client`'s text format).",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": {"$ref": "#/components/responses/Unauthorized"},
                "500": {"$ref": "#/components/responses/Internal"},
                "503": _error(
                    "The store cannot be read now (its runs by state are part of every scrape).",
                    "store_unavailable",
                ),
            },
        },
    },
    "/v1/openapi.json": {
        "get": {
            "operationId": "getOpenApi",
            "summary": "This document",
            "responses": _responses({"200": ("The OpenAPI 3.1 document.", {"type": "object"})}),
        },
    },
    **FORK_PATHS,
    **SETTINGS_PATHS,
    **SESSION_PATHS,
}

# The streamed model step (Accept: text/event-stream, or ?stream=1): ticker
# frames while the call runs, then one complete (or error) frame.
_MODEL_STEP = PATHS["/v1/client-runs/{run_id}/model-step"]["post"]
_MODEL_STEP["parameters"].append(
    {
        "name": "stream",
        "in": "query",
        "schema": {"const": "1"},
        "description": "Answer as server-sent events (as `Accept: text/event-stream` does).",
    }
)
_MODEL_STEP["responses"]["200"]["content"]["text/event-stream"] = {
    "schema": {
        "description": (
            "One frame as an SSE client reads it: `event:` names it, `data:` is its JSON "
            "(`x-frame-schemas` by event name); no `id:`."
        ),
        **_object(
            {
                "event": {"enum": ["delta", "complete", "error"]},
                "data": {"type": "string", "contentMediaType": "application/json"},
            },
            ["event", "data"],
        ),
    },
    "x-frame-schemas": {
        "delta": _object(
            {
                "type": {"enum": ["text_delta", "thinking_delta", "usage"]},
                "index": _SEQ,
                "text": {"type": "string"},
                "thinking": {"type": "string"},
                "usage": {"type": "object"},
            },
            ["type"],
        ),
        "complete": _ref("ModelStepDone"),
        "error": _object(
            {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "object"},
            },
            ["code", "message"],
        ),
    },
}

DOCUMENT: JSON = {
    "openapi": "3.1.0",
    "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
    "info": {
        "title": "salvor control plane",
        "version": __version__,
        "summary": (
            "Durable execution for AI agent runs: agents, runs, their verbs, and the event stream."
        ),
        "description": (
            "Every refusal is the one error envelope with a precise 4xx. A path outside `paths` "
            "is `NoRoute` (404 `not_found`), a method a path does not list is `MethodNotAllowed` "
            "(405 `method_not_allowed`, with `Allow`); with --auth-token every route but the "
            "login is 401 `unauthorized` without the bearer token or a live session cookie "
            f"(`{SESSION_COOKIE}`, from `POST /v1/session`), and a state-changing request the "
            f"cookie authenticates is 403 `forbidden` without its session's `{CSRF_HEADER}` or "
            "from another origin. Refusals of the HTTP layer itself carry the "
            "envelope too and close the connection: 400 `bad_request` (not well-formed HTTP), "
            "408 `request_timeout` (a body that stalls), 431 `headers_too_large`, "
            "501 `not_implemented` (a transfer-coding other than chunked), "
            "505 `http_version_not_supported`. A JSON body is strict: UTF-8 without a BOM, no "
            "duplicate key, at most 128 levels of nesting, and no string or key anywhere holding "
            "U+0000 or a lone surrogate (the store cannot keep either), and no integer beyond "
            "±9007199254740991 (2**53 - 1; RFC 8785 hashing has no exact form for one: send it as "
            "a string), else 400 `bad_request` (a graph document that breaks them is the "
            "`malformed_document` of its `invalid_graph`); this holds for every string and "
            "number below and is stated once, here."
        ),
        "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
    },
    "servers": [
        {"url": "http://127.0.0.1:8420", "description": "`salvor serve` on its default address"}
    ],
    # Optional: only a server started with --auth-token checks it.
    "security": [{"bearer": []}, {"session": []}, {}],
    "paths": PATHS,
    "components": {
        "schemas": SCHEMAS,
        "parameters": PARAMETERS,
        "responses": RESPONSES,
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": (
                    "The token in the environment variable `salvor serve --auth-token` names."
                ),
            },
            "session": {
                "type": "apiKey",
                "in": "cookie",
                "name": SESSION_COOKIE,
                "description": (
                    "The page's session, from `POST /v1/session`. A state-changing request (POST, "
                    f"PUT, PATCH, DELETE) it authenticates must send `{CSRF_HEADER}` (the "
                    "`Csrf` parameter) with the session's csrf token, and an `Origin`, if sent, "
                    "must be the daemon's own (a WebSocket handshake must send one); else 403 "
                    "`forbidden`."
                ),
            },
        },
    },
}


def _codes(schema: JSON) -> set[str]:
    """The codes an error response's schema narrows ``error.code`` to.

    None for the bare envelope.
    """
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return set() if name == "Error" else _codes(SCHEMAS[name])
    found: set[str] = set()
    for part in (*schema.get("allOf", ()), *schema.get("oneOf", ())):
        found |= _codes(part)
    code = schema.get("properties", {}).get("error", {}).get("properties", {}).get("code", {})
    return found | ({code["const"]} if "const" in code else set(code.get("enum", ())))


def _check_codes() -> None:
    """Every refusal is listed under the status its code answers with (``CODE_STATUS``).

    Raises:
        RuntimeError: at import, naming each operation, status and code that disagree.
    """
    wrong = []
    for path, operations in PATHS.items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if "$ref" in response:
                    response = RESPONSES[response["$ref"].rsplit("/", 1)[1]]
                schema = response.get("content", {}).get("application/json", {}).get("schema")
                if int(status) < 400 or schema is None:
                    continue
                wrong += [
                    f"{method.upper()} {path} {status}: {code}"
                    for code in sorted(_codes(schema))
                    if CODE_STATUS.get(code) != int(status)
                ]
    if wrong:
        raise RuntimeError(
            f"the OpenAPI document lists refusals under a status their code does not answer "
            f"with: {'; '.join(wrong)}"
        )


def _add_forbidden() -> None:
    """List 403 ``forbidden`` on every operation the caller check guards (all but the login, which
    lists its own); an operation that already answers 403 for its own reason lists both codes."""
    forbidden = {"$ref": "#/components/responses/Forbidden"}
    for operations in PATHS.values():
        for operation in operations.values():
            if operation.get("security") == [{}]:
                continue
            responses = operation["responses"]
            given = responses.get("403")
            if given is None:
                responses["403"] = forbidden
            elif "$ref" not in given:
                schema = given["content"]["application/json"]["schema"]
                codes = _codes(schema)
                if "forbidden" not in codes:
                    # A new object: one response can be shared by several operations.
                    responses["403"] = _error(
                        f"{given['description']} With --auth-token, also `forbidden`: "
                        f"{_FORBIDDEN_WHY}",
                        *sorted(codes | {"forbidden"}),
                    )
            operation["responses"] = dict(sorted(responses.items()))


_add_forbidden()
_check_codes()


def _llm_variants(choices: tuple[LlmChoice, ...]) -> list[JSON]:
    """What ``Credentials.check_llm`` admits, one ``anyOf`` branch per
    provider and declared endpoint."""
    variants: list[JSON] = [
        {"required": ["provider"], "properties": {"provider": {"const": "demo"}}}
    ]
    for choice in choices:
        required = [] if choice.provider == DEFAULT_PROVIDER else ["provider"]
        if not choice.default:
            required.append("base_url")
        variants.append(
            {
                "required": required,
                "properties": {
                    "provider": {"const": choice.provider},
                    "base_url": {"const": choice.base_url},
                    "api_key_env": {"const": choice.key_env} if choice.key_env else {"not": {}},
                },
            }
        )
    return variants


@functools.cache
def _served(
    tools: tuple[str, ...] | None, process_agents: bool, llm_choices: tuple[LlmChoice, ...] | None
) -> JSON:
    document = copy.deepcopy(DOCUMENT)
    schemas = document["components"]["schemas"]
    if llm_choices is not None:
        schemas["BuiltinAgent"]["properties"]["llm"]["anyOf"] = _llm_variants(llm_choices)
    if tools is not None:
        schemas["ToolName"] = {**schemas["ToolName"], "enum": list(tools)} if tools else {"not": {}}
    if not process_agents:
        schemas["AgentDefinition"] = {
            "description": (
                "An agent as JSON: this daemon accepts built-in agents only over HTTP (process and "
                "service agents need --allow-process-agents)."
            ),
            "allOf": [_ref("BuiltinAgent")],
        }
    return document


def openapi_document(
    *,
    tools: Iterable[str] | None = None,
    process_agents: bool = True,
    llm_choices: Iterable[LlmChoice] | None = None,
) -> JSON:
    """The document (shared: do not mutate it).

    Args:
        tools: the names the daemon's tool registry holds, so that a tool
            name the document admits is one registration accepts; None
            leaves them unnamed.
        process_agents: whether the daemon accepts process and service
            agents over HTTP (``--allow-process-agents``).
        llm_choices: the model endpoints the operator declared
            (``Credentials.llm_choices``), so that an ``[llm]`` table the
            document admits is one registration accepts; None leaves
            ``base_url`` and ``api_key_env`` any string.
    """
    if tools is None and process_agents and llm_choices is None:
        return DOCUMENT
    return _served(
        None if tools is None else tuple(sorted(tools)),
        process_agents,
        None if llm_choices is None else tuple(llm_choices),
    )
