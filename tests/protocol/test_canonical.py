"""RFC 8785 canonical JSON and the sha256: hashes built on it."""

from __future__ import annotations

import hashlib
import json
import re
import struct

import pytest
from salvor.protocol import canonical_json, sha256_hash

NUMBERS: list[tuple[object, str]] = [
    (0, "0"),
    (-0.0, "0"),
    (0.0, "0"),
    (1.0, "1"),
    (-1.0, "-1"),
    (123.0, "123"),
    (4.5, "4.5"),
    (0.002, "0.002"),
    (1e21, "1e+21"),
    (1e20, "100000000000000000000"),
    (1e-7, "1e-7"),
    (1.5e-7, "1.5e-7"),
    (0.000001, "0.000001"),
    (1.2345e-5, "0.000012345"),
    (-3.3333333333333333e-06, "-0.0000033333333333333333"),
    (5e-324, "5e-324"),
    (1e300, "1e+300"),
    (1e30, "1e+30"),
    (1e-27, "1e-27"),
    (1.5e16, "15000000000000000"),
    (2.0**53, "9007199254740992"),
    (2.0**68, "295147905179352830000"),
    (333333333.33333329, "333333333.3333333"),
    (1424953923781206.2, "1424953923781206.2"),
    (12, "12"),
    (-(2**40), "-1099511627776"),
]

# RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical text.
IEEE: list[tuple[str, str]] = [
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


@pytest.mark.parametrize(("value", "expected"), NUMBERS, ids=[e for _, e in NUMBERS])
def test_numbers(value: object, expected: str) -> None:
    assert canonical_json(value) == expected.encode()


@pytest.mark.parametrize(("bits", "expected"), IEEE, ids=[b for b, _ in IEEE])
def test_rfc8785_number_vectors(bits: str, expected: str) -> None:
    value = struct.unpack(">d", bytes.fromhex(bits))[0]
    assert canonical_json(value) == expected.encode()


def test_keys_sort_by_utf16_code_units() -> None:
    # RFC 8785 section 3.2.3: a non-BMP key (surrogates D83D DE00) sorts
    # before a BMP key above the surrogate range (U+FB33), unlike code points.
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    keys = [key for key in json.loads(canonical_json(value))]
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    assert sorted(value) != keys  # code-point order would differ


def test_rfc8785_structure_example() -> None:
    text = (
        '{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],'
        r'"string":"\u20ac$\u000F\u000aA\'\u0042\u0022\u005c\\\"\/",'
        '"literals":[null,true,false]}'
    ).replace("\\'", "'")
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_json(json.loads(text)) == expected.encode("utf-8")


STRINGS: list[tuple[str, str]] = [
    ("\u0000\u0001\u001f", '"\\u0000\\u0001\\u001f"'),
    ("\b\t\n\f\r", '"\\b\\t\\n\\f\\r"'),
    ('"\\/', '"\\"\\\\/"'),
    ("\u007f", '"\u007f"'),
    ("café 😀 \u2028", '"café 😀 \u2028"'),
    ("", '""'),
]


@pytest.mark.parametrize(("value", "expected"), STRINGS, ids=[repr(v) for v, _ in STRINGS])
def test_strings(value: str, expected: str) -> None:
    assert canonical_json(value) == expected.encode("utf-8")


def test_structure_has_no_whitespace_and_nests() -> None:
    value = {"b": [1, {"d": None, "c": True}], "a": {"z": 1.0, "y": []}}
    assert canonical_json(value) == b'{"a":{"y":[],"z":1},"b":[1,{"c":true,"d":null}]}'
    assert canonical_json((1, 2)) == b"[1,2]"
    assert canonical_json({}) == b"{}"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), [float("nan")]])
def test_nan_and_infinity_are_refused(value: object) -> None:
    with pytest.raises(ValueError):
        canonical_json(value)
    with pytest.raises(ValueError):
        sha256_hash(value)


@pytest.mark.parametrize("value", [{1: "x"}, {None: 1}, {"a": {2: 3}}, {1, 2}, b"x", object()])
def test_non_json_values_are_a_type_error(value: object) -> None:
    with pytest.raises(TypeError):
        canonical_json(value)


def test_sha256_hash_format() -> None:
    digest = sha256_hash({"b": 1, "a": [1.0, "x"]})
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert digest == "sha256:" + hashlib.sha256(b'{"a":[1,"x"],"b":1}').hexdigest()
    # Pinned: what any JCS library computes for the empty object.
    assert (
        sha256_hash({}) == "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )
    # Key order and number spelling do not change a hash; values do.
    assert sha256_hash({"a": 1, "b": 2}) == sha256_hash({"b": 2.0, "a": 1.0})
    assert sha256_hash({"a": 1}) != sha256_hash({"a": "1"})
