"""RFC 8785 (JCS) canonical JSON and the ``sha256:`` content hashes built on it.

Every hash salvor records (``agent_def_hash``, ``request_hash``, derived
idempotency keys) is ``sha256:`` + hex over these bytes, so any client can
recompute one with an off-the-shelf JCS library.

Integers beyond ±(2**53 - 1) have no RFC 8785 form: JCS reads every number
as a double, and JCS libraries refuse such an integer or round it. Nothing a
caller submits holds one (``parse_strict`` and ``check_document`` refuse
them), so they reach this module only inside what a model or a tool said
(an id in a tool call's input, say), whose hashes the daemon compares with
its own log. Those are written with all their digits, as before: rounding
would change recorded hashes and give two different ids one identity.
"""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal
from typing import Any

_encode_string = json.JSONEncoder(ensure_ascii=False).encode


def _number(value: float) -> str:
    # ECMAScript Number-to-String over the shortest round-tripping digits
    # (which repr gives): plain decimal for 1e-7 < |value| < 1e21, otherwise
    # an exponent with a sign. The digits come from repr, never from the
    # exact binary value, so 2.0**68 prints as 295147905179352830000.
    if math.isnan(value) or math.isinf(value):
        raise ValueError("canonical JSON has no representation for NaN or Infinity")
    if value == 0:
        return "0"
    text = repr(value)
    if "e" not in text:
        return text.removesuffix(".0")
    mantissa, exponent = text.split("e")
    exp = int(exponent)
    if -7 < exp < 21:
        # repr chose an exponent where JavaScript would not: spell it out.
        plain = format(Decimal(text), "f")
        return plain.rstrip("0").rstrip(".") if "." in plain else plain
    mantissa = mantissa.removesuffix(".0")
    return f"{mantissa}e{'+' if exp > 0 else '-'}{abs(exp)}"


# Recursion: one frame per level of nesting, bounded: every value a caller sends is at most
# MAX_NESTING (128) levels deep (protocol/_strict_json.py), and what the daemon wraps around it adds
# a few, far under Python's limit of 1000. A deeper value from a trusted peer (a model's answer, an
# MCP server's result) raises RecursionError, which fails the run
# (Runtime.drive) instead of the daemon.
def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_encode_string(value))
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_number(value))
    elif isinstance(value, dict):
        out.append("{")
        first = True
        # RFC 8785 orders members by the UTF-16 code units of their names.
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"object keys must be strings, not {type(key).__name__}")
        for key in sorted(value, key=lambda k: k.encode("utf-16-be")):
            if not first:
                out.append(",")
            first = False
            out.append(_encode_string(key))
            out.append(":")
            _write(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not a JSON value")


def reference_canonical_json(value: Any) -> bytes:
    """The RFC 8785 bytes by the plain encoder above (what the fast path must equal)."""
    out: list[str] = []
    _write(value, out)
    return "".join(out).encode("utf-8")


# The fast path: for a value of plain types with no float anywhere and no
# object key that UTF-16 would order differently from code points, the
# stdlib's C encoder with sorted keys and compact separators writes exactly
# the RFC 8785 text:
# * strings: the same encoder as `_encode_string` (escapes `"`, `\\` and
#   controls, `\u00xx` in lower-case hex, everything else literal);
# * integers: `int.__repr__`, the same digits as `str`;
# * members: `sorted` compares keys by code point, and for keys made only of
#   BMP characters that are not surrogates each character is one UTF-16 code
#   unit equal to its code point, so the two orders agree. (A supplementary
#   character is a surrogate pair, whose lead unit sorts below U+E000..U+FFFF:
#   those keys, and lone surrogates, take the plain encoder.)
# Floats take the plain encoder too: `repr` is not ECMAScript's number format.
_encode_sorted = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), check_circular=False
).encode
_SCALARS = frozenset({str, int, bool, type(None)})


def _key_orders_alike(key: str) -> bool:
    if key.isascii():
        return True
    top = max(key)
    if top < "\ud800":
        return True
    return top <= "\uffff" and not any("\ud800" <= char <= "\udfff" for char in key)


# Recursion: as `_write`'s: every value a caller sends is at most
# MAX_NESTING (128) levels deep (protocol/_strict_json.py), and what the daemon wraps around it adds
# a few, far under Python's limit of 1000. A deeper value from a trusted peer (a model's answer, an
# MCP server's result) raises RecursionError, which fails the run
# (Runtime.drive) instead of the daemon.
def _plain(value: Any) -> bool:
    """True when the C encoder writes the RFC 8785 text of ``value`` (see above)."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            # ASCII first: nearly every key is, and the call below costs more than the test.
            if type(key) is not str or not (key.isascii() or _key_orders_alike(key)):
                return False
            if type(item) not in _SCALARS and not _plain(item):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:
            if type(item) not in _SCALARS and not _plain(item):
                return False
        return True
    return kind in _SCALARS


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of a JSON value.

    Raises:
        TypeError: the value holds something JSON cannot represent.
        ValueError: the value holds NaN or an infinity.
    """
    if _plain(value):
        return _encode_sorted(value).encode("utf-8")
    return reference_canonical_json(value)


def sha256_hash(value: Any) -> str:
    """``sha256:<hex>`` over the canonical JSON of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()
