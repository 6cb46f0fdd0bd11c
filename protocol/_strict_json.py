"""Strict, bounded JSON: the one way a value a caller sent becomes a Python value.

Rules:
* UTF-8 only: a byte-order mark, UTF-16/32 and invalid UTF-8 are refused
  (``json.loads`` on bytes would guess an encoding and read them).
* At most ``MAX_NESTING`` levels of arrays and objects. The depth is measured
  on the raw text, iteratively, before ``json.loads`` (which recurses) sees it,
  so no input can reach a recursive walk deeper than the limit; every walk in
  protocol/ and daemon/ over a caller's value relies on that bound.
* No duplicate keys, no NaN or Infinity, no number out of a double's range.
* No integer beyond I-JSON's exact range, ±(2**53 - 1): RFC 8785 hashes
  every number as a double, so an off-the-shelf JCS library rounds (or
  refuses) such an integer and could not recompute our hash. A caller sends a
  bigger one as a string. What relays a model's or a tool's words opts out
  (``big_integers``: the loopback proxies, the envelope reader): they are
  recorded as they came.
* No NUL character and no lone surrogate in any string or key: PostgreSQL's
  JSONB and text refuse both, and a lone surrogate has no UTF-8 form, so
  refusing them here keeps both backends (and every hash) equal.

Every refusal is a ``MalformedJson`` (400 ``bad_request``) naming what is
wrong and quoting at most a short prefix of what was sent. A value another
parser read (a TOML definition) is held to the same rules by ``check_document``.
"""

from __future__ import annotations

import array
import itertools
import json
import math
import re
from typing import Any

from ._error_codes import ErrorCode
from ._errors import ProtocolError, excerpt

MAX_NESTING = 128
# The largest integer every JSON reader keeps exact: a double's significand (I-JSON, RFC 7493).
MAX_EXACT_INTEGER = 2**53 - 1
# Digits of MAX_EXACT_INTEGER: a longer integer is out of range, a shorter one within it.
_EXACT_DIGITS = len(str(MAX_EXACT_INTEGER))
# JSON has no leading zeros, so an integer out of range has at least that many digits in a row. A
# text without such a run (digits mapped to "0", then one substring search: far cheaper than a
# regex) is read by the C parser alone, without a Python call per integer (which costs 2-3x).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * _EXACT_DIGITS

# A JSON string, or an unterminated one to the end of the text. The possessive quantifiers and
# the end-of-text alternative keep the scan linear: a pattern that could fail and retry from the
# next quote takes quadratic time on text such as `"\"\"\"...` (an 8 MB body would hold the loop).
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# Each bracket as a signed byte, +1 opening and -1 closing, so the running depth is summed in C.
_SIGNS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BOM = b"\xef\xbb\xbf"
_WIDE_BOMS = (
    b"\xff\xfe",
    b"\xfe\xff",
    b"\x00\x00\xfe\xff",
)  # UTF-16 LE/BE; UTF-32 LE starts as UTF-16 LE


class MalformedJson(ProtocolError):
    """Text a caller sent that is not strict JSON within the limits above (the sender's fault)."""

    code = ErrorCode.BAD_REQUEST


class _InexactInteger(ValueError):
    """Raised out of ``json.loads`` by ``_exact_integer``; ``parse_strict`` reports its text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _inexact_integer(what: str, text: str) -> MalformedJson:
    return MalformedJson(
        f"{what} holds the integer {excerpt(text, 24)}, outside ±{MAX_EXACT_INTEGER} (2**53 - 1), "
        "where every JSON reader and RFC 8785 hash keeps an integer exact; send it as a string"
    )


def _exact(value: int) -> bool:
    return -MAX_EXACT_INTEGER <= value <= MAX_EXACT_INTEGER


def _integer_reader(data: bytes | str, big_integers: bool):
    """The reader of ``data``'s integers for ``json.loads``: ``int``
    (None) when none is out of range."""
    if big_integers:
        return None  # before any encoding: an envelope read back from the store pays nothing here
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if _LONG_RUN not in data.translate(_DIGITS_AS_ZERO):
        return None
    return _exact_integer


def _exact_integer(text: str) -> int:
    """``json.loads``'s reader of integer literals, refusing one beyond the exact range."""
    # Longer text is refused on its length alone, before int() spends time on its digits.
    if len(text) - text.startswith("-") > _EXACT_DIGITS:
        raise _InexactInteger(text)
    value = int(text)
    if not _exact(value):
        raise _InexactInteger(text)
    return value


def text_depth(text: str, limit: int = MAX_NESTING) -> int:
    """How deeply the arrays and objects of a JSON text nest (0 for a scalar), without recursing.

    Brackets inside strings do not count. Below ``limit`` the answer may be
    an upper bound rather than the depth. On text that is not JSON the
    number is only an estimate, which is harmless: the parser refuses it.
    """
    opens = text.count("[") + text.count("{")
    if opens <= limit:
        return opens  # an upper bound, and within the limit: no need to look closer
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    signs = array.array("b", brackets.encode("ascii").translate(_SIGNS))
    return max(itertools.accumulate(signs), default=0)


def value_depth(value: Any) -> int:
    """How deeply the lists and dicts of a parsed value nest, walking it
    with a stack (no recursion)."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def check_nesting(value: Any, what: str) -> None:
    """Refuse a parsed value (a TOML document, say) nested deeper than ``MAX_NESTING``.

    Raises:
        MalformedJson: it is deeper than the limit.
    """
    depth = value_depth(value)
    if depth > MAX_NESTING:
        raise MalformedJson(f"{what} nests {depth} levels deep; the limit is {MAX_NESTING}")


def _leaves(value: Any):
    """Every key and every scalar of a parsed value, by an explicit stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield from item.keys()
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            yield item


def _check_string(text: str, what: str) -> None:
    if "\x00" in text:
        raise MalformedJson(f"{what} holds a NUL character (\\u0000), which the store cannot keep")
    found = _SURROGATE.search(text)
    if found:
        raise MalformedJson(
            f"{what} holds a lone surrogate (\\u{ord(found.group()):04x}), "
            "which is not a Unicode character"
        )


def _check_characters(value: Any, what: str, nul: bool = False) -> None:
    # Its own walk, strings only: the envelopes a fold reads go through here, so no generator of
    # every leaf and no call per number.
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is str:
            if ("\x00" in item and not nul) or _SURROGATE.search(item):
                _check_string(item.replace("\x00", "") if nul else item, what)
        elif type(item) is dict:
            for key in item:
                if ("\x00" in key and not nul) or _SURROGATE.search(key):
                    _check_string(key.replace("\x00", "") if nul else key, what)
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)


def check_document(value: Any, what: str) -> None:
    """Hold a value another parser read (a TOML document, say) to ``parse_strict``'s rules.

    TOML carries what strict JSON refuses: 64-bit integers, ``inf`` and
    ``nan``, dates and times, ``\\u0000``; each is refused here as
    ``parse_strict`` refuses it in JSON text, so the document hashes (RFC
    8785) and stores alike on both backends.

    Raises:
        MalformedJson: naming the first rule broken; the value is left as it was.
    """
    check_nesting(value, what)
    for item in _leaves(value):
        kind = type(item)
        if kind is str:
            _check_string(item, what)
        elif kind is int:
            if not _exact(item):
                raise _inexact_integer(what, str(item))
        elif kind is float:
            if not math.isfinite(item):
                raise MalformedJson(f"{what} holds {item}, which is not a JSON number")
        elif item is not None and kind is not bool:
            raise MalformedJson(
                f"{what} holds {excerpt(item, 32)} (a {kind.__name__}), which JSON "
                "cannot carry; write it as a string"
            )


def _unique(pairs: list[tuple[str, Any]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key `{excerpt(key)}` appears twice in one object")
            seen.add(key)
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {excerpt(text)} is out of range")
    return value


# The two decoders ``parse_strict`` uses, built once (``json.loads`` with hooks builds one per
# call): keyed by the integer reader, None for ``int``.
_DECODERS = {
    reader: json.JSONDecoder(
        object_pairs_hook=_unique,
        parse_constant=_constant,
        parse_float=_finite,
        parse_int=reader,
    )
    for reader in (None, _exact_integer)
}


def decode_text(data: bytes, what: str) -> str:
    """``data`` as UTF-8 text, refusing a BOM, UTF-16/32 and invalid UTF-8.

    Raises:
        MalformedJson: naming which of those it is.
    """
    if data.startswith(_BOM):
        raise MalformedJson(f"{what} starts with a byte-order mark; send UTF-8 without one")
    if data.startswith(_WIDE_BOMS):
        raise MalformedJson(
            f"{what} is UTF-16 or UTF-32 (it starts with that byte-order mark); send UTF-8"
        )
    if b"\x00" in data:
        # UTF-16 and UTF-32 put NUL bytes beside every ASCII character; UTF-8 text never holds one.
        raise MalformedJson(f"{what} holds a NUL byte: send UTF-8 (UTF-16 and UTF-32 are refused)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedJson(
            f"{what} is not UTF-8 (UTF-16 and UTF-32 are refused): invalid byte at "
            f"offset {exc.start}"
        ) from None


def parse_strict(
    data: bytes | str,
    what: str = "the body",
    *,
    limit: int = MAX_NESTING,
    big_integers: bool = False,
    nul: bool = False,
) -> Any:
    """The value of a strict JSON text (see the module's rules); ``what`` names it in a refusal.

    ``limit`` is the nesting allowed (``MAX_NESTING`` for anything a caller
    sends; a little more for a document that wraps a caller's value).
    ``big_integers`` reads integers beyond ±(2**53 - 1) exactly instead of
    refusing them: only for text that relays what a model or a tool produced
    (the loopback proxies, an envelope the daemon wrote), never for a
    document a caller submits. ``nul`` lets a NUL character through: only for a body whose
    caller then holds every string but those that carry one by design to the rule
    (``check_document``), as a flow's member keys do.

    Raises:
        MalformedJson: the text breaks a rule; nothing else has seen it.
    """
    if isinstance(data, (bytes, bytearray)):
        text = decode_text(data, what)
    else:
        text = data
    depth = text_depth(text, limit)
    if depth > limit:
        raise MalformedJson(
            f"{what} nests arrays and objects {depth} levels deep; the limit is {limit}"
        )
    try:
        value = _DECODERS[_integer_reader(data, big_integers)].decode(text)
    except _InexactInteger as exc:
        raise _inexact_integer(what, exc.text) from None
    except RecursionError:  # unreachable under the limit; kept so no parse can ever escape as one
        raise MalformedJson(f"{what} is nested too deeply; the limit is {limit}") from None
    except ValueError as exc:
        raise MalformedJson(f"{what} is not valid JSON: {exc}") from None
    # Escapes are the only way to a NUL or a lone surrogate in UTF-8 input (a raw NUL in a JSON
    # string is refused by the parser itself); a str may also carry raw surrogates, which one
    # search of the text finds. Only text with an escape needs the walk of its strings.
    if "\\u" in text or (text is data and _SURROGATE.search(text)):
        _check_characters(value, what, nul)
    return value
