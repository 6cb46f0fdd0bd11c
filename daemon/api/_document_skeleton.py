"""The OpenAPI document without its paths: its info, groups, shared parameters and components.

``openapi_document`` fills the paths in from the routes' declarations. Plain data, built at import.
"""

from __future__ import annotations

from salvor import __version__

from ..web import CSRF_HEADER, SESSION_COOKIE
from ._component_schemas import SCHEMAS
from ._refusals import RESPONSES
from ._schema import JSON
from ._schema import ref as _ref

# -- parameters ------------------------------------------------------------------------------------

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
