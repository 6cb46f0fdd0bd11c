"""The OpenAPI document's shared refusals, and the check of the status each refusal is under.

``RESPONSES`` are the refusals every declaration may name (``_operation``'s statuses). Every
refusal a declaration lists is checked against the code table (``CODE_STATUS``) when the document
is built (``check_codes``), and a session-cookie caller's 403 is added to every guarded operation
(``with_forbidden``). Plain data; no IO.
"""

from __future__ import annotations

from salvor.protocol import ERROR_STATUS

from ..web import CSRF_HEADER, FAILED_TRIES, WINDOW_SECONDS
from ._component_schemas import SCHEMAS
from ._operation import error as _error
from ._schema import JSON

# -- the error-code table --------------------------------------------------------------------------
# The one table of codes and their statuses (``salvor.protocol.ErrorCode``): every refusal this
# document lists is checked against it at import (``check_codes``), so a route documented under a
# status its code does not answer with fails every test.
CODE_STATUS = ERROR_STATUS


FORBIDDEN_WHY = (
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
    # hears; added to every operation by ``with_forbidden``.
    "Forbidden": _error(FORBIDDEN_WHY[0].upper() + FORBIDDEN_WHY[1:], "forbidden"),
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


def codes_of(schema: JSON) -> set[str]:
    """The codes an error response's schema narrows ``error.code`` to.

    None for the bare envelope.
    """
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return set() if name == "Error" else codes_of(SCHEMAS[name])
    found: set[str] = set()
    for part in (*schema.get("allOf", ()), *schema.get("oneOf", ())):
        found |= codes_of(part)
    code = schema.get("properties", {}).get("error", {}).get("properties", {}).get("code", {})
    return found | ({code["const"]} if "const" in code else set(code.get("enum", ())))


def check_codes(paths: JSON) -> None:
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
                    for code in sorted(codes_of(schema))
                    if CODE_STATUS.get(code) != int(status)
                ]
    if wrong:
        raise RuntimeError(
            f"the OpenAPI document lists refusals under a status their code does not answer "
            f"with: {'; '.join(wrong)}"
        )


def with_forbidden(operation: JSON) -> JSON:
    """``operation`` listing 403 ``forbidden``, as the browser rules and the caller check answer
    every operation; one that already answers 403 for its own reason lists both codes."""
    responses = operation["responses"]
    given = responses.get("403")
    if given is None:
        responses["403"] = {"$ref": "#/components/responses/Forbidden"}
    elif "$ref" not in given:
        codes = codes_of(given["content"]["application/json"]["schema"])
        if "forbidden" not in codes:
            responses["403"] = _error(
                f"{given['description']} Also `forbidden`: {FORBIDDEN_WHY}",
                *sorted(codes | {"forbidden"}),
            )
    operation["responses"] = dict(sorted(responses.items()))
    return operation
