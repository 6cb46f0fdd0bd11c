"""Schema checks: recorded suspension schemas and the budget-extension shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from salvor.protocol import (
    BUDGET_EXTENSION_SCHEMA,
    MalformedEvent,
    SchemaViolation,
    check_schema,
    validate,
    validate_budget_extension,
)

from .logs import APPROVAL_SCHEMA, UNTYPED_SCHEMA

NESTED = {"type": "object", "properties": {"refund": {"required": ["amount"]}}}
IN_ITEMS = {"type": "array", "items": {"properties": {"id": {"type": "string"}}}}
IN_ANY_OF = {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}

# (schema, value, accepted, violation path, message fragment)
CHECKS = [
    (APPROVAL_SCHEMA, {"approved": True}, True, None, None),
    (APPROVAL_SCHEMA, {"approved": "yes"}, False, "$.approved", "$.approved must be boolean"),
    (APPROVAL_SCHEMA, {}, False, "$", "$ must contain ['approved'] properties"),
    (UNTYPED_SCHEMA, {"approved": 1}, True, None, None),
    (UNTYPED_SCHEMA, None, False, "$", "$ must be object"),
    (UNTYPED_SCHEMA, 7, False, "$", "$ must be object"),
    (UNTYPED_SCHEMA, 2.5, False, "$", "$ must be object"),
    (UNTYPED_SCHEMA, "yes", False, "$", "$ must be object"),
    (UNTYPED_SCHEMA, [], False, "$", "$ must be object"),
    (UNTYPED_SCHEMA, True, False, "$", "$ must be object"),
    ({"properties": {"a": {}}}, None, False, "$", "$ must be object"),
    ({"properties": {"a": {}}}, {}, True, None, None),
    (NESTED, {"refund": {"amount": 1}}, True, None, None),
    (NESTED, {"refund": 3}, False, "$.refund", "$.refund must be object"),
    (NESTED, {}, True, None, None),
    (IN_ITEMS, [{"id": "x"}, {"id": "y"}], True, None, None),
    (IN_ITEMS, [{"id": "x"}, "y"], False, "$[1]", "$[1] must be object"),
    (IN_ITEMS, [{"id": "x"}, {"id": 2}], False, "$[1].id", "$[1].id must be string"),
    (IN_ANY_OF, {"b": 1}, True, None, None),
    (IN_ANY_OF, "b", False, "$", "$ cannot be validated by any definition"),
    # A schema with a typed root keeps its type; an explicit type is not overridden.
    ({"type": ["object", "null"], "required": ["a"]}, None, True, None, None),
    ({"type": "string", "properties": {"a": {}}}, "s", True, None, None),
    # Plain schemas with neither keyword are untouched.
    ({}, None, True, None, None),
    ({"type": "integer"}, 3, True, None, None),
    ({"type": "integer"}, 3.5, False, "$", "$ must be integer"),
    # A property named like a keyword is a property, not a keyword.
    (
        {"type": "object", "properties": {"required": {"type": "string"}}},
        {"required": "x"},
        True,
        None,
        None,
    ),
    (
        {"type": "object", "properties": {"type": {"type": "string"}}},
        {"type": 1},
        False,
        "$.type",
        "must be string",
    ),
    # Data keywords hold values, never schemas.
    ({"const": {"required": ["a"]}}, {"required": ["a"]}, True, None, None),
    ({"enum": [{"properties": 1}]}, {"properties": 1}, True, None, None),
]


@pytest.mark.parametrize(("schema", "value", "accepted", "path", "message"), CHECKS)
def test_validate(schema: dict, value: object, accepted: bool, path: str, message: str) -> None:
    check_schema(schema)
    if accepted:
        validate(schema, value)
        return
    with pytest.raises(SchemaViolation) as caught:
        validate(schema, value, what="the resume input")
    violation = caught.value
    assert (violation.code, violation.status) == ("bad_request", 400)
    assert violation.message.startswith("the resume input does not satisfy the recorded schema: ")
    assert len(violation.violations) == 1
    assert violation.violations[0]["path"] == path
    assert message in violation.violations[0]["message"]
    assert violation.violations[0]["message"] in violation.message
    assert set(violation.violations[0]) == {"path", "message"}


def test_validate_does_not_change_the_schema() -> None:
    schema = {"properties": {"x": {"required": ["y"]}}}
    validate(schema, {"x": {"y": 1}})
    assert schema == {"properties": {"x": {"required": ["y"]}}}


UNUSABLE = [
    {"type": "nonsense"},
    {"type": 5},
    {"minLength": "x"},
    {"type": "string", "pattern": "("},
    {"required": "approved"},
    {"properties": []},
    {"$ref": "#/definitions/missing"},
    {"$ref": "http://127.0.0.1:9/schema.json"},
    {"$ref": "https://example.com/schema.json"},
]


@pytest.mark.parametrize("schema", UNUSABLE, ids=repr)
def test_unusable_schemas_are_malformed(schema: dict) -> None:
    with pytest.raises(MalformedEvent) as caught:
        check_schema(schema)
    assert "not a usable JSON schema" in caught.value.message
    with pytest.raises(MalformedEvent):
        validate(schema, {})


@pytest.mark.parametrize("schema", [None, [], "object", True, 1])
def test_a_schema_must_be_an_object(schema: object) -> None:
    with pytest.raises(MalformedEvent):
        check_schema(schema)


def test_a_file_ref_is_never_read(tmp_path: Path) -> None:
    target = tmp_path / "schema.json"
    target.write_text('{"type": "string"}')
    with pytest.raises(MalformedEvent, match="is not resolved"):
        check_schema({"$ref": target.as_uri()})


def test_local_refs_resolve() -> None:
    schema = {
        "definitions": {"amount": {"type": "integer", "minimum": 1}},
        "type": "object",
        "properties": {"amount": {"$ref": "#/definitions/amount"}},
    }
    validate(schema, {"amount": 3})
    with pytest.raises(SchemaViolation):
        validate(schema, {"amount": 0})


def test_a_schema_that_recurses_without_end_is_a_violation() -> None:
    schema = {"$ref": "#"}
    check_schema(schema)
    with pytest.raises(SchemaViolation, match="recurses without end"):
        validate(schema, {"a": 1})


@pytest.mark.parametrize("value", [{"extend_by": 1}, {"extend_by": 0.5}, {"extend_by": 10**9}])
def test_budget_extension_accepts(value: dict) -> None:
    validate_budget_extension(value)


BAD_EXTENSIONS = [
    {},
    {"extend_by": 0},
    {"extend_by": -1},
    {"extend_by": -0.5},
    {"extend_by": 5, "note": "x"},
    {"extend_by": "5"},
    {"extend_by": True},
    {"extend_by": None},
    {"extend": 5},
    None,
    5,
    [5],
]


@pytest.mark.parametrize("value", BAD_EXTENSIONS, ids=repr)
def test_budget_extension_refuses(value: object) -> None:
    with pytest.raises(SchemaViolation) as caught:
        validate_budget_extension(value)
    assert caught.value.message.startswith("a budget extension does not satisfy")
    assert caught.value.violations


def test_budget_extension_schema_shape() -> None:
    assert BUDGET_EXTENSION_SCHEMA["required"] == ["extend_by"]
    assert BUDGET_EXTENSION_SCHEMA["additionalProperties"] is False
