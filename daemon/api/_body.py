"""How the control plane declares each JSON request body once, as a typed ``Body``, and reads it.

A handler reads its body with ``BODY.read()``: the strict JSON reader first
(``web.json_object``: a JSON content type (else 415), strict JSON, an object, no field outside
the declaration, none of the required ones missing), then each field's own
check, in the order declared, each refusal a 400 ``bad_request`` naming the
field. The OpenAPI document's request schemas are ``BODY.schema()``: the same
fields, the same required set, closed. What a handler accepts and what the
document describes are one declaration, so they cannot drift apart.

A ``check`` is the part of a field's rule the handler needs as code (a
type, a run id put in canonical form); the ``schema`` says the same to a
client. Rules beyond one field are the handler's; ``rules`` states them to
the document. Built at import; reading a body keeps no state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..flows import caller_labels
from ..recording import parse_run_id
from ..web import bad_request, object_from
from ._http import json_object
from ._schema import JSON, closed, nullable


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    """One field of a body.

    ``check`` takes the value as sent and returns it as the handler uses it,
    or raises ``OperationRefused`` (bad_request); it is skipped for a null
    when the field is ``nullable`` (the handler reads null as left out).
    """

    name: str
    schema: JSON
    required: bool = False
    nullable: bool = False
    check: Callable[[Any], Any] | None = None
    description: str = ""

    def described(self) -> JSON:
        schema = nullable(self.schema) if self.nullable else self.schema
        return {**schema, "description": self.description} if self.description else schema


@dataclass(frozen=True, slots=True)
class Body:
    """A request body: its fields, and what the document calls it.

    ``optional``: an empty body reads as ``{}``. ``precheck`` refuses a body
    whose fields do not go together before any field is checked (``rules``
    says the same in JSON Schema).
    """

    name: str
    fields: tuple[Field, ...]
    description: str = ""
    optional: bool = False
    precheck: Callable[[dict], None] | None = None
    rules: JSON = field(default_factory=dict)
    allowed: frozenset[str] = field(init=False)
    required: frozenset[str] = field(init=False)
    _checked: tuple[Field, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", frozenset(f.name for f in self.fields))
        object.__setattr__(self, "required", frozenset(f.name for f in self.fields if f.required))
        object.__setattr__(self, "_checked", tuple(f for f in self.fields if f.check is not None))

    async def read(self) -> dict:
        """The Quart request's body, checked whole.

        Raises:
            OperationRefused: bad_request (400), unsupported_media_type (415),
                payload_too_large (413) or request_timeout (408); nothing has been recorded.
        """
        body = await json_object(
            allowed=self.allowed, required=self.required, optional_body=self.optional
        )
        return self.checked(body)

    def from_bytes(self, data: bytes, mimetype: str, *, nul: bool = False) -> dict:
        """``read`` on a body already read whole, with its media type.

        The media type is lower case, with no parameters. ``nul`` lets NUL characters through
        (``object_from``): the caller holds the strings that may not carry one to the rule.
        """
        body = object_from(
            data,
            mimetype,
            allowed=self.allowed,
            required=self.required,
            optional_body=self.optional,
            nul=nul,
        )
        return self.checked(body)

    def checked(self, body: dict) -> dict:
        if self.precheck is not None:
            self.precheck(body)
        for spec in self._checked:
            if spec.name in body:
                value = body[spec.name]
                if value is not None or not spec.nullable:
                    body[spec.name] = spec.check(value)
        return body

    def schema(self) -> JSON:
        """The body as a closed JSON Schema object, for ``components.schemas[name]``."""
        described = closed(
            {f.name: f.described() for f in self.fields},
            [f.name for f in self.fields if f.required],
            **self.rules,
        )
        return {"description": self.description, **described} if self.description else described


# -- the checks fields share ----------------------------------------------------------------------


def string_check(message: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise bad_request(message)
        return value

    return check


def run_id_check(message: str) -> Callable[[Any], str]:
    is_string = string_check(message)
    return lambda value: parse_run_id(is_string(value))


def labels_check(value: Any) -> dict[str, str]:
    # The one label check every door uses (a run started here, a client run's RunStarted, the CLI).
    return caller_labels(value)


def boolean_check(message: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise bad_request(message)
        return value

    return check


def object_check(message: str) -> Callable[[Any], dict]:
    def check(value: Any) -> dict:
        if not isinstance(value, dict):
            raise bad_request(message)
        return value

    return check


def list_check(message: str) -> Callable[[Any], list]:
    def check(value: Any) -> list:
        if not isinstance(value, list):
            raise bad_request(message)
        return value

    return check
