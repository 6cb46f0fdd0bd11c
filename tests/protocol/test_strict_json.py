"""The strict, bounded JSON parser: one table of texts, what each parses to or why it is refused."""

from __future__ import annotations

import sys
import tomllib

import pytest
from salvor.protocol import (
    MAX_EXACT_INTEGER,
    MAX_NESTING,
    Envelope,
    MalformedJson,
    RunStarted,
    ToolCallRequested,
    check_document,
    check_nesting,
    decode_envelope,
    encode_envelope,
    parse_strict,
    value_depth,
)
from salvor.protocol._strict_json import text_depth


def arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


ACCEPTED = [
    ('{"a": 1}', {"a": 1}),
    ('"[[[[{{{{"', "[[[[{{{{"),  # brackets inside a string are no nesting
    ('["\\"[[[[", {"k\\\\": "]]"}]', ['"[[[[', {"k\\": "]]"}]),
    ('"\\u00e9\\ud83d\\ude00"', "é\U0001f600"),  # an escaped surrogate pair is one character
    (arrays(MAX_NESTING), eval(arrays(MAX_NESTING))),
    ("-0.5e3", -500.0),
    # I-JSON's exact range, both ends included.
    ("[9007199254740991, -9007199254740991, -0]", [2**53 - 1, -(2**53 - 1), 0]),
    ("1e20", 1e20),  # a double, read as every JSON reader reads it
    ("9007199254740993.0", 2.0**53),  # likewise: rounded, as a double is
]
REFUSED = [
    (
        arrays(MAX_NESTING + 1),
        f"nests arrays and objects {MAX_NESTING + 1} levels deep; the limit is {MAX_NESTING}",
    ),
    (
        '{"s": "' + "[" * 500 + '", "d": ' + arrays(MAX_NESTING + 1) + "}",
        f"{MAX_NESTING + 2} levels deep",
    ),
    (arrays(100_000), "100000 levels deep"),
    ('{"a": 1, "a": 1}', "the key `a` appears twice in one object"),
    ('[{"k": {"x": 1, "y": 2, "x": 3}}]', "the key `x` appears twice"),
    ('{"' + "k" * 500 + '": 1, "' + "k" * 500 + '": 2}', "`" + "k" * 64 + "…` appears twice"),
    ('"\\u0000"', "NUL character (\\u0000)"),
    ('{"a\\u0000": 1}', "NUL character"),
    ('"\\ud800"', "lone surrogate (\\ud800)"),
    ('["\\udfff x"]', "lone surrogate (\\udfff)"),
    ("NaN", "NaN is not a JSON value"),
    ("[Infinity]", "Infinity is not a JSON value"),
    ("1e400", "out of range"),
    ("9007199254740992", "the integer 9007199254740992, outside ±9007199254740991 (2**53 - 1)"),
    ('{"a": [-9007199254740992]}', "the integer -9007199254740992, outside"),
    ("1" + "0" * 20, "the integer 100000000000000000000, outside"),
    # Refused on its length alone, and quoted short.
    ("-" + "9" * 5000, "the integer -" + "9" * 23 + "…, outside"),
    ("{", "is not valid JSON"),
    ('"a\nb"', "is not valid JSON"),  # a raw control character in a string
]
REFUSED_BYTES = [
    (b'\xef\xbb\xbf{"a": 1}', "starts with a byte-order mark; send UTF-8 without one"),
    (
        '{"a": 1}'.encode("utf-16"),
        "is UTF-16 or UTF-32 (it starts with that byte-order mark); send UTF-8",
    ),
    ('{"a": 1}'.encode("utf-32"), "is UTF-16 or UTF-32"),
    (
        '{"a": 1}'.encode("utf-16-be"),
        "holds a NUL byte: send UTF-8 (UTF-16 and UTF-32 are refused)",
    ),
    (
        b'{"a": "\xc3\x28"}',
        "is not UTF-8 (UTF-16 and UTF-32 are refused): invalid byte at offset 7",
    ),
    (b'"\xed\xa0\x80"', "is not UTF-8"),  # a surrogate encoded raw is not UTF-8 either
]


@pytest.mark.parametrize(("text", "value"), ACCEPTED)
def test_strict_json_accepts(text: str, value) -> None:
    assert parse_strict(text) == value
    assert parse_strict(text.encode()) == value


@pytest.mark.parametrize(("text", "fragment"), REFUSED)
def test_strict_json_refuses(text: str, fragment: str) -> None:
    for data in (text, text.encode()):
        with pytest.raises(MalformedJson) as refused:
            parse_strict(data, "the input")
        assert refused.value.message.startswith("the input ")
        assert fragment in refused.value.message
        assert (refused.value.code, refused.value.status) == ("bad_request", 400)
        assert len(refused.value.message) < 200


@pytest.mark.parametrize(("data", "fragment"), REFUSED_BYTES)
def test_strict_json_refuses_what_is_not_utf8(data: bytes, fragment: str) -> None:
    with pytest.raises(MalformedJson, match="^the body ") as refused:
        parse_strict(data)
    assert fragment in refused.value.message


def test_a_raw_lone_surrogate_in_text_is_refused_too() -> None:
    with pytest.raises(MalformedJson, match="lone surrogate"):
        parse_strict('"\ud800"')


def test_the_depth_is_measured_without_recursion() -> None:
    # Far past what any recursive walk could survive: only an iterative scan answers.
    depth = sys.getrecursionlimit() * 50
    assert text_depth(arrays(depth)) == depth
    assert text_depth('{"a": [1, {"b": []}], "c": "[[[[\\"{{"}', limit=0) == 4  # the exact scan
    value: object = 1
    for _ in range(depth):
        value = [value]
    assert value_depth(value) == depth
    with pytest.raises(
        MalformedJson, match=f"nests {depth} levels deep; the limit is {MAX_NESTING}"
    ):
        check_nesting(value, "the definition")
    check_nesting(parse_strict(arrays(MAX_NESTING)), "the definition")


def test_the_depth_scan_stays_linear_on_strings_that_never_close() -> None:
    # Over the fast path's bracket count, then 4 MB that a naive string pattern would rescan from
    # every escaped quote (quadratic: hours). Both are measured in one
    # pass and refused for their depth.
    brackets = "[" * (MAX_NESTING + 1)
    for text in (brackets + '"' + '\\"' * 2_000_000, brackets + '"' + "a" * 4_000_000 + "\\"):
        assert text_depth(text) == MAX_NESTING + 1
        with pytest.raises(MalformedJson, match="levels deep"):
            parse_strict(text)


def test_an_envelope_holding_a_limit_deep_input_reads_back() -> None:
    run_input = parse_strict(arrays(MAX_NESTING - 1))
    envelope = Envelope(
        run_id="r",
        seq=0,
        schema_version=1,
        recorded_at="2026-01-01T00:00:00Z",
        event=RunStarted(agent_def_hash="sha256:" + "0" * 64, input=run_input),
    )
    assert decode_envelope(encode_envelope(envelope)) == envelope


def test_relayed_text_reads_big_integers_exactly() -> None:
    # What a loopback proxy relays of a model's answer: an id past 2**53 is kept to the digit.
    text = '{"id": 123456789012345678901, "n": -9007199254740993}'
    assert parse_strict(text, big_integers=True) == {"id": 123456789012345678901, "n": -(2**53) - 1}
    with pytest.raises(MalformedJson, match="integer 123456789012345678901, outside"):
        parse_strict(text)
    # The other rules still hold for relayed text.
    with pytest.raises(MalformedJson, match="appears twice"):
        parse_strict('{"a": 1, "a": 2}', big_integers=True)


def test_an_envelope_holding_a_models_big_integer_reads_back() -> None:
    event = ToolCallRequested(
        tool="lookup",
        input={"message_id": 1234567890123456789012},
        effect="read",
        idempotency_key="k",
    )
    envelope = Envelope(
        run_id="r", seq=3, schema_version=1, recorded_at="2026-01-01T00:00:00Z", event=event
    )
    assert decode_envelope(encode_envelope(envelope)) == envelope


DOCUMENTS_REFUSED = [
    ("n = 9007199254740992", "the integer 9007199254740992, outside ±9007199254740991"),
    ("[t]\nn = [-9223372036854775808]", "the integer -9223372036854775808, outside"),
    ("x = inf", "holds inf, which is not a JSON number"),
    ("x = [-nan]", "holds nan, which is not a JSON number"),
    ("when = 1979-05-27", "holds 1979-05-27 (a date), which JSON cannot carry; write it as a"),
    ("[a]\nat = 07:32:00", "holds 07:32:00 (a time)"),
    ("at = 1979-05-27T07:32:00Z", "(a datetime)"),
    ('s = "a\\u0000b"', "NUL character (\\u0000)"),
    ('"k\\u0000" = 1', "NUL character"),
]


@pytest.mark.parametrize(
    ("toml", "fragment"), DOCUMENTS_REFUSED, ids=[t for t, _ in DOCUMENTS_REFUSED]
)
def test_a_toml_document_is_held_to_the_json_rules(toml: str, fragment: str) -> None:
    with pytest.raises(MalformedJson) as refused:
        check_document(tomllib.loads(toml), "the definition")
    assert refused.value.message.startswith("the definition holds ")
    assert fragment in refused.value.message
    assert (refused.value.code, refused.value.status) == ("bad_request", 400)


def test_check_document_accepts_what_strict_json_reads() -> None:
    toml = f'a = {MAX_EXACT_INTEGER}\nb = -{MAX_EXACT_INTEGER}\nc = 1e300\nd = [true, "\U0001f600"]'
    value = tomllib.loads(toml)
    check_document(value, "the definition")
    check_document(parse_strict('{"a": [1, 2.5, null, {"b": "\\ue000"}]}'), "the body")
    with pytest.raises(MalformedJson, match="nests 129 levels deep"):
        check_document(eval(arrays(MAX_NESTING + 1)), "the definition")
    with pytest.raises(MalformedJson, match=r"holds b'x' \(a bytes\)"):
        check_document({"a": [b"x"]}, "the value")
