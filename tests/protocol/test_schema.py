"""Schema checks: recorded suspension schemas and the budget-extension shape."""

from __future__ import annotations

import threading
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
from salvor.protocol._schema import (
    _COMPILED,
    MAX_PATTERN_CHARS,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_ENUM,
    MAX_SCHEMA_VALUES,
    SCHEMA_CACHE_BYTES,
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


def _nested(levels: int) -> dict:
    """A schema of ``allOf`` in ``allOf``: two containers to a level."""
    schema: dict = {}
    for _ in range(levels):
        schema = {"allOf": [schema]}
    return schema


# Each schema crosses one bound, and the refusal names it.
OVER_BOUNDS = [
    ({"enum": list(range(MAX_SCHEMA_ENUM + 1))}, f"an enum may have at most {MAX_SCHEMA_ENUM}"),
    # 300,000 values: refused by counting, long before it is compiled or even written out.
    ({"enum": [[0]] * 300_000}, f"an enum may have at most {MAX_SCHEMA_ENUM}"),
    (
        {"type": "object", "properties": {f"p{i}": {} for i in range(MAX_SCHEMA_VALUES)}},
        f"more than {MAX_SCHEMA_VALUES} values",
    ),
    (
        {"anyOf": [{"const": [i, i]} for i in range(MAX_SCHEMA_VALUES // 3)]},
        f"more than {MAX_SCHEMA_VALUES} values",
    ),
    (_nested(MAX_SCHEMA_DEPTH), f"deeper than {MAX_SCHEMA_DEPTH} levels"),
    ({"description": "x" * MAX_SCHEMA_BYTES}, f"at most {MAX_SCHEMA_BYTES}"),
    ({"pattern": "a" * (MAX_PATTERN_CHARS + 1)}, f"at most {MAX_PATTERN_CHARS}"),
    ({"patternProperties": {"b" * (MAX_PATTERN_CHARS + 1): {}}}, f"at most {MAX_PATTERN_CHARS}"),
]


@pytest.mark.parametrize(("schema", "named"), OVER_BOUNDS, ids=lambda v: repr(v)[:40])
def test_a_schema_over_a_bound_is_refused_naming_it(schema: dict, named: str) -> None:
    with pytest.raises(MalformedEvent) as caught:
        check_schema(schema)
    assert "not a usable JSON schema: it is too large" in caught.value.message or (
        "pattern" in caught.value.message
    )
    assert named in caught.value.message
    with pytest.raises(MalformedEvent):
        validate(schema, {})


def test_a_schema_at_the_bounds_compiles() -> None:
    check_schema(_nested(MAX_SCHEMA_DEPTH // 2 - 1))
    check_schema({"enum": list(range(MAX_SCHEMA_ENUM))})
    check_schema({"type": "string", "pattern": "a" * MAX_PATTERN_CHARS})
    validate({"type": "object", "properties": {f"p{i}": {} for i in range(1000)}}, {"p1": 1})


# Patterns RE2 cannot run: each refused where the schema is checked, naming where it is.
NOT_LINEAR = [
    ({"type": "string", "pattern": r"^(a)\1$"}, "$.pattern", "invalid escape sequence"),
    ({"properties": {"code": {"pattern": "(?=x)y"}}}, "$.properties.code.pattern", "(?="),
    ({"patternProperties": {"(?<!x)y": {}}}, "$.patternProperties", "(?<"),
    ({"propertyNames": {"pattern": "(a)(?P=x)"}}, "$.propertyNames.pattern", "does not compile"),
]


@pytest.mark.parametrize(("schema", "where", "reason"), NOT_LINEAR, ids=repr)
def test_a_pattern_re2_cannot_run_is_refused(schema: dict, where: str, reason: str) -> None:
    with pytest.raises(MalformedEvent) as caught:
        check_schema(schema)
    message = caught.value.message
    assert message.startswith("not a usable JSON schema: the pattern at " + where), message
    assert reason in message
    assert "backreferences, lookahead and lookbehind are not supported" in message


def _in_a_thread(work, bound: float = 30.0) -> None:
    """Run ``work`` on a thread and fail unless it ends within ``bound`` seconds (a generous
    bound: a backtracking engine takes days on these inputs, RE2 microseconds)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"still matching after {bound} s"
    if failure:
        raise failure[0]


def test_a_catastrophic_pattern_is_matched_in_linear_time() -> None:
    # ^(a+)+$ against 25 a's and a b took 6 s with Python's re, doubling with each a.
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}}}
    value = {"code": "a" * 64 + "b"}

    def work() -> None:
        with pytest.raises(SchemaViolation, match=r"\$\.code must match pattern"):
            validate(schema, value)
        validate(schema, {"code": "a" * 64})

    _in_a_thread(work)


def test_a_catastrophic_pattern_property_is_matched_in_linear_time() -> None:
    schema = {"patternProperties": {"^(a|aa)+$": {"type": "integer"}}}
    key = "a" * 64 + "b"

    def work() -> None:
        validate(schema, {key: "not checked: no pattern matches the key"})
        with pytest.raises(SchemaViolation):
            validate(schema, {"a" * 64: "x"})

    _in_a_thread(work)


def test_a_required_name_is_matched_against_patterns_in_linear_time() -> None:
    # fastjsonschema itself matches such names with Python's re while it compiles.
    pattern = {"^(a+)+$": {"type": "integer"}}
    covered = {"required": ["aaaa"], "additionalProperties": False, "patternProperties": pattern}
    _in_a_thread(lambda: validate({**covered, "properties": {}}, {"aaaa": 1}))
    with pytest.raises(SchemaViolation):
        validate({**covered, "properties": {}}, {"aaaa": 1, "b": 2})
    with pytest.raises(SchemaViolation, match=r"\$\.aaaa must be integer"):
        validate({**covered, "properties": {}}, {"aaaa": "x"})
    uncovered = {**covered, "properties": {}, "required": ["a" * 64 + "b"]}

    def work() -> None:
        with pytest.raises(MalformedEvent, match="no property or pattern allows it"):
            check_schema(uncovered)

    _in_a_thread(work)


def test_patterns_keep_json_schema_anchors() -> None:
    # `$` is the end of the text, as in ECMA-262: a trailing newline does not match it.
    validate({"pattern": r"^\d+$"}, "12")
    with pytest.raises(SchemaViolation):
        validate({"pattern": r"^\d+$"}, "12\n")
    validate({"pattern": "b"}, "abc")  # unanchored: anywhere in the text


def test_the_compiled_schema_cache_is_bounded_by_weight() -> None:
    # Many distinct schemas, each near the size cap: the cache keeps their text under its budget
    # and forgets the oldest, instead of holding a compiled copy of each.
    filler = "x" * (MAX_SCHEMA_BYTES // 2)
    for i in range(2 * SCHEMA_CACHE_BYTES // len(filler) + 4):
        check_schema({"description": filler, "minLength": i})
    assert _COMPILED.weight() <= SCHEMA_CACHE_BYTES
    check_schema({"description": filler, "minLength": 0})  # evicted, compiled again: still works


def test_a_schema_validated_again_is_found_by_itself_until_it_is_changed(monkeypatch) -> None:
    # A tool's schema is one object validated at every call: its check is found without writing
    # the schema out as text again, and a schema changed in place is checked as it is now.
    from salvor.protocol import _schema

    texts = []
    real = _schema.schema_text
    monkeypatch.setattr(_schema, "schema_text", lambda schema: texts.append(1) or real(schema))
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}
    for n in (1, 2, 3):
        validate(schema, {"n": n})
    assert len(texts) <= 1
    schema["properties"]["n"]["minimum"] = 5
    with pytest.raises(SchemaViolation):
        validate(schema, {"n": 3})
    validate(schema, {"n": 5})
