"""The canonical-JSON fast path writes exactly what the plain RFC 8785 encoder writes.

``canonical_json`` hands values with no floats and no UTF-16-sensitive keys
to the stdlib's C encoder. These tests hold it to the plain encoder
(``reference_canonical_json``) on random JSON, including the keys and strings
where code-point order and UTF-16 order part ways, and check that a value the
fast path must refuse still gets the right bytes (or the same error).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from salvor.protocol import canonical_json
from salvor.protocol._canonical import _plain, reference_canonical_json

# Characters that matter to the encoder: controls (escaped), quotes and
# backslashes, DEL and the line separators (literal), the BMP just below and
# above the surrogates, the private-use area, and supplementary characters,
# whose UTF-16 lead unit sorts below U+E000..U+FFFF.
_TRICKY = st.sampled_from(
    [
        "\x00",
        "\x01",
        "\x08",
        "\t",
        "\n",
        "\x0c",
        "\r",
        "\x1f",
        '"',
        "\\",
        "/",
        "\x7f",
        "\u2028",
        "\u2029",
        "\ud7ff",
        "\ue000",
        "\uf8ff",
        "\ufb33",
        "\uffee",
        "\uffff",
        "\U00010000",
        "\U0001f600",
        "\U0010ffff",
        "a",
        "A",
        "0",
        "é",
        "€",
    ]
)
_CHARS = st.one_of(_TRICKY, st.characters(exclude_categories=("Cs",)))
_TEXT = st.text(_CHARS, max_size=8)
_INTS = st.one_of(st.integers(min_value=-(2**63), max_value=2**63), st.integers())
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)


def _json(scalars: st.SearchStrategy) -> st.SearchStrategy:
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=5),
            st.dictionaries(_TEXT, children, max_size=5),
        ),
        max_leaves=30,
    )


_NO_FLOATS = _json(st.one_of(st.none(), st.booleans(), _INTS, _TEXT))
_ANY = _json(st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, _TEXT))


@settings(max_examples=400, deadline=None)
@given(_NO_FLOATS)
def test_fast_path_equals_reference_without_floats(value):
    assert canonical_json(value) == reference_canonical_json(value)


@settings(max_examples=300, deadline=None)
@given(_ANY)
def test_canonical_json_equals_reference_on_any_json(value):
    assert canonical_json(value) == reference_canonical_json(value)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(st.sampled_from(["a", "\ue000", "\uffff", "\U00010000", "\U0001f600"]), max_size=3),
        st.integers(),
        min_size=2,
        max_size=6,
    )
)
def test_member_order_is_utf16_order(value):
    text = canonical_json(value).decode()
    keys = list(json.loads(text))
    assert keys == sorted(value, key=lambda k: k.encode("utf-16-be"))


def test_fast_path_is_taken_for_a_conversation():
    request = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "héllo \U0001f600 \u2028"}]}
        ],
        "tools": ({"name": "t", "input_schema": {"type": "object", "required": ["x"]}},),
    }
    assert _plain(request)
    assert canonical_json(request) == reference_canonical_json(request)


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1.5},
        [0.1, {"b": [2.0]}],
        {"\U00010000": 1, "\ue000": 2},  # the orders disagree: UTF-16 puts the pair first
        {"\ud800": 1},
        {1: "int key"},
        {True: "bool key"},
        {"a": b"bytes"},
        {"a": {1, 2}},
    ],
)
def test_values_the_fast_path_refuses(value):
    assert not _plain(value)


def test_utf16_ordering_example():
    assert canonical_json({"\ue000": 2, "\U00010000": 1}) == '{"\U00010000":1,"\ue000":2}'.encode()


@pytest.mark.parametrize(
    "value",
    [
        {1: "int key"},
        {"a": object()},
        {"a": float("nan")},
        [float("inf")],
        {"a": "\ud800"},  # a lone surrogate has no UTF-8
        {"\udc00": 1},
    ],
)
def test_errors_match_the_reference(value):
    with pytest.raises(Exception) as reference:
        reference_canonical_json(value)
    with pytest.raises(type(reference.value)):
        canonical_json(value)


def test_big_integers_and_enum_subclasses():
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    class Colour(enum.StrEnum):
        RED = "red"

    value = {"n": 2**80, "m": -(2**70), "level": Level.HIGH, "colour": Colour.RED, "t": (1, [2])}
    assert (
        canonical_json(value)
        == reference_canonical_json(value)
        == (
            b'{"colour":"red","level":3,"m":-1180591620717411303424,"n":1208925819614629174706176,"t":[1,[2]]}'
        )
    )
