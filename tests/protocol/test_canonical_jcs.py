"""Our canonical JSON against an independent RFC 8785 implementation (the ``rfc8785`` package).

For every document the daemon accepts (what ``parse_strict`` reads from a
caller's text) our bytes, and so our ``sha256:`` hash, equal what
``rfc8785.dumps`` computes. The integers the daemon refuses are exactly the
ones ``rfc8785`` cannot canonicalize.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import rfc8785
from hypothesis import example, given, settings
from hypothesis import strategies as st
from salvor.protocol import (
    MAX_EXACT_INTEGER,
    MalformedJson,
    canonical_json,
    parse_strict,
    sha256_hash,
)

# Characters where encoders part ways: controls (short and \u00xx escapes), quotes, DEL and the
# line separators (literal), both sides of the surrogate block, the private-use area and U+FFFF
# (one UTF-16 unit each, above every lead surrogate) and astral characters (a surrogate pair,
# which sorts below them in UTF-16 but above them by code point).
_TRICKY = st.sampled_from(
    list('\x01\x08\t\n\x0b\x0c\r\x1f"\\/\x7f\u2028\u2029\ud7ff\ue000\uf8ff\ufb33\uffff')
    + ["\U00010000", "\U0001f600", "\U000f0000", "\U0010ffff", "a", "é", "€"]
)
# Every character but the ones strict JSON refuses (NUL, lone surrogates).
_CHARS = st.one_of(_TRICKY, st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
_TEXT = st.text(_CHARS, max_size=6)
_INTS = st.one_of(
    st.integers(min_value=-MAX_EXACT_INTEGER, max_value=MAX_EXACT_INTEGER),
    st.sampled_from([0, 1, -1, MAX_EXACT_INTEGER, -MAX_EXACT_INTEGER, 2**31, 10**15, 2**53 - 2]),
)
_FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),  # subnormals, -0.0 and the extremes included
    st.sampled_from(
        [-0.0, 1.0, 1e21, 1e-7, 5e-7, 1e-6, 1e20, 2.0**53, 2.0**68, 5e-324, 1.7976931348623157e308]
    ),
)
_SCALARS = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, _TEXT)
_DOCUMENTS = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(_TEXT, children, max_size=6)
    ),
    max_leaves=40,
)


def _accepted(value: object, ascii_only: bool) -> object:
    """The value as the daemon holds it once a caller sent it as JSON text."""
    return parse_strict(json.dumps(value, ensure_ascii=ascii_only).encode(), "the body")


@settings(max_examples=500, deadline=None)
@given(_DOCUMENTS, st.booleans())
@example({"\ue000": 1, "\U0001f600": 2, "\uffff": [-0.0, 1e21]}, False)
def test_canonical_bytes_and_hash_equal_rfc8785(value: object, ascii_only: bool) -> None:
    document = _accepted(value, ascii_only)
    expected = rfc8785.dumps(document)
    assert canonical_json(document) == expected
    assert sha256_hash(document) == "sha256:" + hashlib.sha256(expected).hexdigest()
    # The canonical text reads back to itself. (Relayed, as a proxy reads: a double of 2**53 or
    # more below 1e21 is written as integer digits, which a caller would have to send as a string.)
    assert canonical_json(parse_strict(expected, big_integers=True)) == expected


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(), st.integers(min_value=-(2**54), max_value=2**54)))
@example(MAX_EXACT_INTEGER)
@example(MAX_EXACT_INTEGER + 1)
@example(-MAX_EXACT_INTEGER)
@example(-MAX_EXACT_INTEGER - 1)
def test_the_daemon_refuses_exactly_the_integers_rfc8785_cannot_write(number: int) -> None:
    text = json.dumps({"n": [number]})
    try:
        expected = rfc8785.dumps({"n": [number]})
    except rfc8785.IntegerDomainError:
        with pytest.raises(
            MalformedJson, match=r"holds the integer -?\d+…?, outside ±9007199254740991"
        ):
            parse_strict(text)
        return
    document = parse_strict(text)
    assert canonical_json(document) == expected


# JSON text a caller sends -> the RFC 8785 text of what the daemon holds (ECMAScript number
# formatting: shortest digits, exponent from 1e21 and below 1e-6, no "-0", no ".0").
EDGE_NUMBERS: list[tuple[str, str | None]] = [
    ("1.0", "1"),
    ("-0.0", "0"),
    ("-0", "0"),
    ("0e10", "0"),
    ("1e21", "1e+21"),
    ("1E21", "1e+21"),
    ("1e20", "100000000000000000000"),
    ("999999999999999999999", None),  # an integer beyond 2**53: refused (see below)
    # The same digits as a double: rounded up, as JSON.parse reads them.
    ("999999999999999999999.0", "1e+21"),
    ("5e-7", "5e-7"),
    ("1e-7", "1e-7"),
    ("0.000001", "0.000001"),
    ("0.0000015", "0.0000015"),
    ("123456789012345678", None),
    ("1.23456789012345678e17", "123456789012345680"),
    ("9007199254740991", "9007199254740991"),
    ("-9007199254740991", "-9007199254740991"),
    ("9007199254740992", None),
    ("-9007199254740992", None),
    ("9007199254740992.0", "9007199254740992"),
    ("9007199254740993.0", "9007199254740992"),
    ("4.9e-324", "5e-324"),
    ("2.2250738585072014e-308", "2.2250738585072014e-308"),
    ("1.7976931348623157e308", "1.7976931348623157e+308"),
    ("0.1", "0.1"),
    ("100", "100"),
    ("1.5e300", "1.5e+300"),
    ("-1.5e-300", "-1.5e-300"),
]


@pytest.mark.parametrize(("text", "canonical"), EDGE_NUMBERS, ids=[t for t, _ in EDGE_NUMBERS])
def test_edge_numbers(text: str, canonical: str | None) -> None:
    if canonical is None:
        with pytest.raises(
            MalformedJson,
            match=f"holds the integer {text}, outside ±9007199254740991 "
            r"\(2\*\*53 - 1\), where every JSON reader and RFC 8785 hash",
        ):
            parse_strict(f"[{text}]", "the body")
        with pytest.raises(rfc8785.IntegerDomainError):
            rfc8785.dumps(int(text))
        return
    value = parse_strict(text)
    assert canonical_json(value) == canonical.encode() == rfc8785.dumps(value)


# Hashes the daemon recorded before RFC 8785 conformance was checked (computed with main's
# canonical_json as of this change): a stored run's hashes must still match on resume.
RECORDED = [
    ({}, "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"),
    (
        {
            "model": "m",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": "héllo \U0001f600"}],
        },
        "sha256:3e4f3db6b97cada8edc9ddb7297828168042c5747d624c957c8bf7fdfd4962b0",
    ),
    (
        {"n": [MAX_EXACT_INTEGER, -MAX_EXACT_INTEGER, 0, 1.0, -0.0, 1e21, 5e-7, 0.1, 2.0**68]},
        "sha256:d0e372e583e429f65f806d229ca28cbfd87bb2bc79b044788a64727da4a9b5f5",
    ),
    (
        {
            "\U0001f600": "astral",
            "\ue000": "private use",
            "\uffff": "last",
            'a\n\x1f"\\': "escapes",
        },
        "sha256:0a55f2b88593d4306889865a3c5d633871c82b9c417028e1af9765ae5e9c0f19",
    ),
]


@pytest.mark.parametrize(("document", "recorded"), RECORDED)
def test_hashes_of_documents_accepted_before_are_unchanged(document: object, recorded: str) -> None:
    assert sha256_hash(document) == recorded
    assert recorded == "sha256:" + hashlib.sha256(rfc8785.dumps(document)).hexdigest()
