"""A route's declaration: the rule and method it answers, and everything the API reference says of
it (summary, parameters, request body, answers, refusals), written once beside its handler.

A route module declares one ``Operation`` per handler and registers the handler with
``route(app, OPERATION)``: the rule and the method come from the declaration, so a handler cannot be
reached under a path its declaration does not name. ``operations_of(app)`` reads them back by
walking the app's URL map, which is what the OpenAPI document (``_openapi``) is built from; a
``/v1`` or ``/metrics`` rule registered without a declaration stops that build.

The responses reference the shared components by name (``#/components/...``);
``_document_skeleton`` defines them. Plain data: nothing here reads a request.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quart_trio import QuartTrio

from ._body import Body
from ._schema import JSON, ref

# Where ``route`` files each declaration, by endpoint (the operation's id), in ``app.extensions``.
_EXTENSION = "salvor.operations"

# The shared refusals a declaration names, by status (the components ``_refusals`` defines).
_SHARED = (
    ("400", "BadRequest"),
    ("404", "UnknownRun"),
    ("408", "RequestTimeout"),
    ("413", "PayloadTooLarge"),
    ("507", "InsufficientStorage"),
    ("415", "UnsupportedMediaType"),
)


def documented(path: str) -> bool:
    """Whether a path is API (needs a declaration, and the caller check): ``/v1`` and the metrics,
    not the page's shell or the reference's."""
    return path == "/v1" or path.startswith("/v1/") or path == "/metrics"


def error_schema(codes: list[str] | None = None, details: JSON | None = None) -> JSON:
    """The envelope, its ``code`` narrowed to ``codes`` and its ``details`` to ``details``."""
    if codes is None and details is None:
        return ref("Error")
    inner: JSON = {"properties": {}}
    if codes is not None:
        inner["properties"]["code"] = {"const": codes[0]} if len(codes) == 1 else {"enum": codes}
    if details is not None:
        inner["properties"]["details"] = details
        inner["required"] = ["details"]
    return {"allOf": [ref("Error"), {"properties": {"error": inner}}]}


def error(description: str, *codes: str, schema: JSON | None = None) -> JSON:
    """A refusal: the envelope narrowed to ``codes`` (or ``schema``), under ``description``."""
    return {
        "description": description,
        "content": {"application/json": {"schema": schema or error_schema(list(codes) or None)}},
    }


def parameter(name: str) -> JSON:
    """A shared parameter (``components.parameters[name]``)."""
    return {"$ref": f"#/components/parameters/{name}"}


RUN_ID = (parameter("RunId"),)
DRIVE_TOKEN = parameter("DriveToken")
DRIVEN = (*RUN_ID, DRIVE_TOKEN)
DRIVE_MISSING = error(
    "No drive token, or (with --auth-token) no bearer token.",
    schema=error_schema(["missing_drive_token", "unauthorized"]),
)
DRIVE_FORBIDDEN = error("The drive token is not the run's current lease.", "invalid_drive_token")
# An integer in a query or a header is ASCII digits, at most 18 of them (``web.whole_number``), so
# that no text a caller sends becomes an unbounded int; more digits are a 400.
WHOLE = {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}
WHOLE_TEXT = {"type": "string", "pattern": "^[0-9]{1,18}$"}


def _schema(shape: Any) -> JSON:
    """A JSON schema as given, or a reference to a declared answer (anything with a ``name``)."""
    return shape if isinstance(shape, dict) else ref(shape.name)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Operation:
    """One route: where it is registered and what the document says of it.

    ``answers``: status -> (description, schema or declared ``Answer``), each answered as JSON.
    ``refusals``: the shared ones by name (``BadRequest``, ``UnknownRun``, ``PayloadTooLarge``; a
    route that reads a body, and so names PayloadTooLarge, can also time out reading it: 408).
    ``responses``: any other response object, by status, as it is. Every operation can also answer
    401, 429 (a client that gave too many wrong tokens) and 500, and one that takes a ``body``
    415; ``_refusals.with_forbidden`` adds the 403 of the browser rules and of a session-cookie
    caller to every one.

    Compared and hashed by identity: a declaration is one object, made once at import.
    """

    method: str
    rule: str
    operation_id: str
    tag: str
    summary: str
    description: str = ""
    parameters: tuple[JSON, ...] = ()
    body: Body | JSON | None = None
    answers: Mapping[str, tuple[str, Any]] = field(default_factory=dict)
    refusals: tuple[str, ...] = ()
    responses: Mapping[str, JSON] = field(default_factory=dict)
    open: bool = False
    websocket: bool = False
    # New work (a new run, fork or registration): refused with 507 while the store's filesystem is
    # below the free-space floor (issue 29, item 5), which the app checks before the handler.
    new_work: bool = False

    @property
    def path(self) -> str:
        """The rule as an OpenAPI path template (``<graph:graph_hash>`` -> ``{graph_hash}``)."""
        return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", self.rule)

    def described(self) -> JSON:
        """The operation object of the document (a new one each call: the builder amends it)."""
        operation: JSON = {
            "operationId": self.operation_id,
            "tags": [self.tag],
            "summary": self.summary,
        }
        if self.description:
            operation["description"] = self.description
        if self.open:
            operation["security"] = [{}]
        if self.parameters:
            operation["parameters"] = list(self.parameters)
        if isinstance(self.body, Body):
            operation["requestBody"] = {
                "required": not self.body.optional,
                "content": {"application/json": {"schema": ref(self.body.name)}},
            }
        elif self.body is not None:
            operation["requestBody"] = self.body
        operation["responses"] = self._responses()
        return operation

    def _responses(self) -> JSON:
        responses: JSON = {}
        for status, (description, shape) in self.answers.items():
            responses[status] = {
                "description": description,
                "content": {"application/json": {"schema": _schema(shape)}},
            }
        refusals = set(self.refusals)
        if "PayloadTooLarge" in refusals:
            refusals.add("RequestTimeout")
        if self.new_work:
            refusals.add("InsufficientStorage")
        if self.body is not None:
            # A body not sent as one of the types it takes (no type at all included) is a 415.
            refusals.add("UnsupportedMediaType")
        for status, name in _SHARED:
            if name in refusals:
                responses[status] = {"$ref": f"#/components/responses/{name}"}
        responses.update(self.responses)
        responses.setdefault("401", {"$ref": "#/components/responses/Unauthorized"})
        responses.setdefault("429", {"$ref": "#/components/responses/TooManyRequests"})
        responses["500"] = {"$ref": "#/components/responses/Internal"}
        return dict(sorted(responses.items()))


def route(app: QuartTrio, operation: Operation) -> Callable:
    """Register the decorated handler under ``operation``'s rule and method, declared.

    The endpoint is the operation's id, so two declarations cannot share one.
    """

    def register(handler: Callable) -> Callable:
        declared = app.extensions.setdefault(_EXTENSION, {})
        if operation.operation_id in declared:
            raise RuntimeError(f"two routes are declared as {operation.operation_id}")
        declared[operation.operation_id] = operation
        if operation.websocket:
            app.add_websocket(operation.rule, operation.operation_id, handler)
        else:
            app.add_url_rule(
                operation.rule, operation.operation_id, handler, methods=[operation.method.upper()]
            )
        return handler

    return register


def operation_at(app: QuartTrio, endpoint: str | None) -> Operation | None:
    """The declaration registered under ``endpoint`` (a request's), or None for an undeclared
    route (the page's files)."""
    return app.extensions.get(_EXTENSION, {}).get(endpoint)


def operations_of(app: QuartTrio) -> tuple[Operation, ...]:
    """The declarations of every API route the app has registered, in registration order.

    Raises:
        RuntimeError: a ``/v1`` or ``/metrics`` rule registered without ``route`` (so without a
            declaration), naming each one.
    """
    declared: dict[str, Operation] = app.extensions.get(_EXTENSION, {})
    found: list[Operation] = []
    missing: list[str] = []
    for rule in app.url_map.iter_rules():
        operation = declared.get(rule.endpoint)
        if operation is not None:
            found.append(operation)
        elif documented(rule.rule):
            methods = sorted(set(rule.methods or ()) - {"HEAD", "OPTIONS"})
            missing.append(f"{'/'.join(methods)} {rule.rule}")
    if missing:
        raise RuntimeError(
            "routes registered without a declaration (use _operation.route): " + "; ".join(missing)
        )
    return tuple(found)
