"""The OpenAPI 3.1 document of the control plane, served at ``GET /v1/openapi.json``.

Its ``paths`` are read from the routes themselves: each handler is registered with its own
declaration (``_operation.Operation``: summary, parameters, request body, answers, refusals), and
the document is built from the declarations ``operations_of(app)`` finds in the app's URL map, so
it describes exactly the routes the app has. What the declarations reference is defined here,
under ``components``, once: the JSON request bodies (``_bodies``), the fixed-shape answers
(``_answers``, and ``client_runs.CLIENT_RUN_ANSWERS`` for a client-driven run's steps), the shapes
the pure core emits (``protocol.WIRE_SCHEMAS``: status, pending, envelope with each event kind's
payload, replay), a run summary's keys (``store.SUMMARY_KEYS``), and each table of an agent
definition checked against the parser's own field lists (``_agent_schemas``): a mismatch stops the
build. Written here: the shared refusals, the error envelope's named variants, the event stream's
frames and the security schemes. Every refusal a declaration lists is checked against the code
table (``CODE_STATUS``) when the document is built, and a session-cookie caller's 403 is added to
every guarded operation. Built once per set of routes; plain data, no IO.

tests/daemon/api/test_openapi.py checks the document against the OpenAPI 3.1 schema and validates
real responses of a real daemon against it, so a handler that drifts from its declaration fails a
test; ``docs/openapi.json`` is the document a README daemon serves (``python -m
salvor.daemon.api._reference`` writes it).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable

from salvor import __version__
from salvor.protocol import ERROR_STATUS, WIRE_SCHEMAS
from salvor.store import SUMMARY_KEYS, SUMMARY_REQUIRED

from ..agents import DEFAULT_PROVIDER, DeclaredOrigin, LlmChoice
from ..client_runs import CLIENT_RUN_ANSWERS
from ..tools import FILE_TOOLS
from ..web import CSRF_HEADER, FAILED_TRIES, SESSION_COOKIE, WINDOW_SECONDS
from ._agent_schemas import AGENT_SCHEMAS
from ._answers import ANSWERS, DRIVER, DRIVER_NODE, DRIVER_RULE
from ._bodies import BODIES
from ._fork_schemas import FORK_ANSWERS, FORK_SCHEMAS
from ._graph_schemas import GRAPH_ANSWERS, GRAPH_SCHEMAS
from ._operation import Operation
from ._operation import error as _error
from ._operation import error_schema as _error_schema
from ._schema import INSTANT as _INSTANT
from ._schema import JSON
from ._schema import closed as _object
from ._schema import exactly as _exactly
from ._schema import ref as _ref
from ._served_origins import NOTHING, dialled
from ._session_schemas import SESSION_ANSWERS, SESSION_SCHEMAS
from ._settings_schemas import SETTINGS_ANSWERS, SETTINGS_SCHEMAS

# -- shared shapes ---------------------------------------------------------------------------------


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
                keys | {DRIVER.name, DRIVER_NODE.name},
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
                    DRIVER_NODE.name: DRIVER_NODE.described(),
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


_FORBIDDEN_WHY = (
    "a request whose `Host` does not name this daemon (localhost, a loopback address, the "
    "--listen host or a name given with --allow-host), or one carrying an `Origin` that is "
    "neither the daemon's own (the one its `Host` names) nor given with --allow-origin, with a "
    "token or without; and with --auth-token, a request the session cookie authenticates that "
    f"changes state without the session's `{CSRF_HEADER}`. Nothing changed."
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
    "PayloadTooLarge": _error(
        "The body, or one payload it would record, is over the payload limit (8 MiB by default, "
        "`--max-payload-bytes`; 1 MiB for an agent definition), or what it would record is over "
        "the run's quota (`--max-run-events`, `--max-run-bytes`). Nothing recorded; "
        "`details.limit` names it.",
        "payload_too_large",
        "quota_exceeded",
    ),
    "InsufficientStorage": _error(
        "The store's filesystem is below the free-space floor new work needs "
        "(`--min-free-bytes`); running runs go on. Nothing recorded.",
        "insufficient_storage",
    ),
    "RequestTimeout": _error(
        "The body did not arrive whole in time (60 s by default); nothing recorded, "
        "and the connection closes.",
        "request_timeout",
    ),
    "Internal": _error("An unexpected failure; the daemon's log has the rest.", "internal"),
    # Every operation can answer it (``Operation._responses``): the caller check counts wrong
    # tokens per client (``web._throttle``).
    "TooManyRequests": {
        **_error(
            "With --auth-token: this client gave --token-tries wrong tokens (default "
            f"{FAILED_TRIES}; login or bearer) within {WINDOW_SECONDS:g} seconds of the first; "
            "every try of a token from it is refused, uncompared, until those seconds have "
            "passed. Nothing changed.",
            "too_many_requests",
        ),
        "headers": {
            "Retry-After": {
                "description": "Whole seconds until the client may try a token again.",
                "schema": {"type": "integer", "minimum": 1},
            }
        },
    },
    # What a browser's request (``web.Browsers``) or a session-cookie caller (``web.admit``)
    # hears; added to every operation by ``_with_forbidden``.
    "Forbidden": _error(_FORBIDDEN_WHY[0].upper() + _FORBIDDEN_WHY[1:], "forbidden"),
    "UnsupportedMediaType": _error(
        "The body was not sent as a type this operation takes: a JSON body must say "
        "`Content-Type: application/json` (an `application/*+json` type and parameters such as "
        "`charset` are fine; no type at all is not). An empty body needs none. Nothing recorded.",
        "unsupported_media_type",
    ),
    # No operation answers these two: they are what a path or method outside `paths` gets.
    "NoRoute": _error("No route at that path (any method).", "not_found"),
    "MethodNotAllowed": {
        **_error("The path exists, the method does not.", "method_not_allowed"),
        "headers": {
            "Allow": {"description": "The methods the path answers.", "schema": {"type": "string"}}
        },
    },
}


# The groups the reference lists operations under (each declaration names one), in reading order.
TAGS: tuple[JSON, ...] = (
    {"name": "agents", "description": "Agent definitions: registered, stored by content hash."},
    {
        "name": "graphs",
        "description": "Graph documents: validated, stored by content hash, and started as runs.",
    },
    {
        "name": "runs",
        "description": (
            "Runs the daemon drives: started, listed, read, watched as server-sent events, "
            "continued, resolved by hand, abandoned and forked."
        ),
    },
    {
        "name": "client-driven runs",
        "description": (
            "Runs a client drives from its own loop under a lease (its drive token): each model "
            "and tool call recorded write-ahead by the daemon."
        ),
    },
    {"name": "live", "description": "One WebSocket carrying many runs' events and the run list."},
    {"name": "settings", "description": "The operator's settings, kept in the store."},
    {"name": "session", "description": "The page's login: a session cookie and its csrf token."},
    {"name": "server", "description": "What the daemon says about itself, and its numbers."},
)

# The document without its paths: the routes' declarations fill them in (``openapi_document``).
SKELETON: JSON = {
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
            f"cookie authenticates is 403 `forbidden` without its session's `{CSRF_HEADER}`; a "
            "client that gave too many wrong tokens lately is 429 `too_many_requests` "
            "(`TooManyRequests`). "
            "With a token or without, every request is 403 `forbidden` when its `Host` does not "
            "name this daemon or it carries an `Origin` other than the daemon's own (or one "
            "given with --allow-origin), and a body read as JSON that does not say "
            "`Content-Type: application/json` is 415 `unsupported_media_type`. Refusals of the "
            "HTTP layer itself carry the envelope too and close the connection: 400 "
            "`bad_request` (not well-formed HTTP, or both Content-Length and Transfer-Encoding), "
            "408 `request_timeout` (a body that stalls), 431 `headers_too_large`, "
            "501 `not_implemented` (a transfer-coding other than chunked), "
            "505 `http_version_not_supported` (HTTP/2 too, unless the daemon runs with --http2). "
            "Every answer carries `X-Content-Type-Options: nosniff` and, but for the page's own "
            "files, `Cache-Control: no-store`. A JSON body is strict: UTF-8 without a BOM, no "
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
    "tags": list(TAGS),
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
                    "`Csrf` parameter) with the session's csrf token, and a WebSocket handshake "
                    "must send an `Origin`; else 403 `forbidden`."
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


def _check_codes(paths: JSON) -> None:
    """Every refusal is listed under the status its code answers with (``CODE_STATUS``).

    Raises:
        RuntimeError: naming each operation, status and code that disagree.
    """
    wrong = []
    for path, operations in paths.items():
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


def _with_forbidden(operation: JSON) -> JSON:
    """``operation`` listing 403 ``forbidden``, as the browser rules and the caller check answer
    every operation; one that already answers 403 for its own reason lists both codes."""
    responses = operation["responses"]
    given = responses.get("403")
    if given is None:
        responses["403"] = {"$ref": "#/components/responses/Forbidden"}
    elif "$ref" not in given:
        codes = _codes(given["content"]["application/json"]["schema"])
        if "forbidden" not in codes:
            responses["403"] = _error(
                f"{given['description']} Also `forbidden`: {_FORBIDDEN_WHY}",
                *sorted(codes | {"forbidden"}),
            )
    operation["responses"] = dict(sorted(responses.items()))
    return operation


def _paths(operations: Iterable[Operation]) -> JSON:
    """The ``paths`` of the declared operations.

    Raises:
        RuntimeError: two declarations of one path and method, a group no ``TAGS`` entry names,
            or a refusal under the wrong status (``_check_codes``).
    """
    tags = {tag["name"] for tag in TAGS}
    paths: JSON = {}
    for operation in operations:
        described = paths.setdefault(operation.path, {})
        if operation.method in described:
            raise RuntimeError(f"{operation.method.upper()} {operation.path} is declared twice")
        if operation.tag not in tags:
            raise RuntimeError(f"{operation.operation_id}: no group {operation.tag!r} in TAGS")
        described[operation.method] = _with_forbidden(operation.described())
    _check_codes(paths)
    return paths


@functools.cache
def _document(operations: tuple[Operation, ...]) -> JSON:
    return {**SKELETON, "paths": _paths(operations)}


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


def _declared_origins(
    schemas: JSON, mcp: tuple[DeclaredOrigin, ...], service: tuple[DeclaredOrigin, ...]
) -> None:
    """An MCP `url` server and a service agent only on a declared origin, naming only the
    variables bound to it; with none declared, no `url` server and no service agent at all."""
    server, agent = schemas["McpServer"], schemas["ServiceAgent"]
    if mcp:
        server["anyOf"] = [{"not": {"required": ["url"]}}, *dialled(mcp, bearer=True)]
    else:
        server["properties"]["url"] = NOTHING
    if service:
        agent["anyOf"] = dialled(service, bearer=False)
    else:
        agent["properties"]["url"] = NOTHING


@functools.cache
def _served(
    operations: tuple[Operation, ...],
    tools: tuple[str, ...] | None,
    process_agents: bool,
    llm_choices: tuple[LlmChoice, ...] | None,
    origins: tuple[tuple[DeclaredOrigin, ...], tuple[DeclaredOrigin, ...]] | None,
    skills: tuple[str, ...] | None = None,
) -> JSON:
    document = copy.deepcopy(_document(operations))
    schemas = document["components"]["schemas"]
    if llm_choices is not None:
        schemas["BuiltinAgent"]["properties"]["llm"]["anyOf"] = _llm_variants(llm_choices)
    if origins is not None:
        _declared_origins(schemas, *origins)
    if tools is not None:
        schemas["ToolName"] = {**schemas["ToolName"], "enum": list(tools)} if tools else {"not": {}}
        # A process agent names file tools only, those the daemon's workspace offers.
        offered = [name for name in tools if name in FILE_TOOLS]
        file_tools = schemas["FileToolName"]
        schemas["FileToolName"] = {**file_tools, "enum": offered} if offered else {"not": {}}
    if skills is not None:
        schemas["SkillName"] = (
            {**schemas["SkillName"], "enum": list(skills)} if skills else {"not": {}}
        )
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
    operations: Iterable[Operation],
    *,
    tools: Iterable[str] | None = None,
    process_agents: bool = True,
    llm_choices: Iterable[LlmChoice] | None = None,
    mcp_origins: Iterable[DeclaredOrigin] | None = None,
    service_origins: Iterable[DeclaredOrigin] | None = None,
    skills: Iterable[str] | None = None,
) -> JSON:
    """The document of ``operations`` (shared: do not mutate it).

    Args:
        operations: the routes' declarations (``operations_of(app)``), in the order the
            document lists them.
        tools: the names the daemon's tool registry holds, so that a tool
            name the document admits is one registration accepts; None
            leaves them unnamed.
        process_agents: whether the daemon accepts process and service
            agents over HTTP (``--allow-process-agents``).
        llm_choices: the model endpoints the operator declared
            (``Credentials.llm_choices``), so that an ``[llm]`` table the
            document admits is one registration accepts; None leaves
            ``base_url`` and ``api_key_env`` any string.
        mcp_origins, service_origins: the origins the operator declared
            (``Credentials.origins``), so that a ``url`` a definition may dial, and the header
            variables it may name, are the ones registration accepts; None (both) leaves them
            any URL and any variable.
        skills: the names the daemon's skill directories hold, so that a skill the document
            admits is one registration resolves; None leaves them any skill name.

    Raises:
        RuntimeError: declarations that do not make a document (``_paths``).
    """
    operations = tuple(operations)
    declared = None
    if mcp_origins is not None or service_origins is not None:
        declared = (tuple(mcp_origins or ()), tuple(service_origins or ()))
    if all(given is None for given in (tools, skills, llm_choices, declared)) and process_agents:
        return _document(operations)
    return _served(
        operations,
        None if tools is None else tuple(sorted(tools)),
        process_agents,
        None if llm_choices is None else tuple(llm_choices),
        declared,
        None if skills is None else tuple(sorted(skills)),
    )
