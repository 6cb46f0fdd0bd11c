"""Checks of values against recorded JSON schemas (suspension inputs) and the
budget-extension shape.

A schema that names ``required`` or ``properties`` without a ``type`` is read
as asking for an object, so a bare ``null``, number or string is refused even
though plain JSON Schema would let it pass vacuously.

A schema comes from whoever wrote a definition, a graph or a tool, so its cost
is bounded before any of it is compiled (``check_bounds``): its size, its
values, its depth and the length of each ``enum``. Its ``pattern``s and
``patternProperties`` are matched by RE2, whose matching time grows with the
text and never with the pattern's backtracking (``^(a+)+$`` is as fast as
``^a+$``); a pattern RE2 cannot run (a backreference, a lookaround) is refused
where the schema is checked, naming where it is. Compiled schemas are kept in
one cache bounded by the size of their text, not by their count.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import fastjsonschema
import re2

from ._canonical import canonical_json
from ._errors import MalformedEvent, SchemaViolation

# The bounds of one schema, each checked before it is compiled. fastjsonschema turns a schema
# into Python source and compiles that: about a millisecond and 50 to 100 times the schema's
# text in memory for each sub-schema, so these keep the worst schema to a fraction of a second.
MAX_SCHEMA_BYTES = 64 * 1024  # its canonical JSON text
MAX_SCHEMA_VALUES = 4096  # every JSON value in it, its keywords' values and data alike
MAX_SCHEMA_DEPTH = 32  # arrays and objects inside one another
MAX_SCHEMA_ENUM = 1024  # the values of one `enum`
MAX_PATTERN_CHARS = 1024  # one `pattern` or `patternProperties` key
# The compiled schemas kept for reuse, weighed by their canonical text (the compiled form is a
# few dozen times larger): a caller who sends many different schemas evicts older ones instead
# of growing the daemon.
SCHEMA_CACHE_BYTES = 1024 * 1024
# The texts of the schemas also found by their object (``_RecentSchemas``), together.
RECENT_SCHEMA_BYTES = 64 * 1024

# One RE2 program may use at most this much memory (RE2's own default is 8 MiB).
_RE2_MAX_MEM = 1024 * 1024

# The one shape a budget-exceeded run is resumed with: how much more of the
# crossed budget to allow.
BUDGET_EXTENSION_SCHEMA = {
    "type": "object",
    "required": ["extend_by"],
    "properties": {"extend_by": {"type": "number", "exclusiveMinimum": 0}},
    "additionalProperties": False,
}


# Keywords whose value maps names to sub-schemas (the map itself is no schema),
# and keywords whose value is data, never a schema.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs"})
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.max_mem = _RE2_MAX_MEM
    # A refused pattern is the caller's error, said in the refusal: not a line on stderr.
    options.log_errors = False
    return options


_RE2_OPTIONS = _re2_options()


def _too_many(what: str) -> MalformedEvent:
    return MalformedEvent(f"not a usable JSON schema: it is too large: {what}")


def _shown(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 64 else pattern[:61] + "...")


def _check_pattern(pattern: str, where: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise MalformedEvent(
            f"not a usable JSON schema: the pattern at {where} ({_shown(pattern)}) is "
            f"{len(pattern)} characters; "
            f"a pattern may have at most {MAX_PATTERN_CHARS}"
        )


def _linear_pattern(pattern: str, where: str) -> Any:
    """``pattern`` compiled by RE2.

    Raises:
        MalformedEvent: RE2 cannot compile it.
    """
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args else "it does not compile"
        raise MalformedEvent(
            f"not a usable JSON schema: the pattern at {where} ({_shown(pattern)}) does not "
            f"compile: {reason} (patterns are matched by RE2, in time linear in the text, so "
            "backreferences, lookahead and lookbehind are not supported)"
        ) from None


def check_bounds(schema: Any) -> dict[str, str]:
    """Check a schema against this module's bounds, before anything costly is done with it.

    Walks at most ``MAX_SCHEMA_VALUES`` values and stops at the first bound crossed, so a
    schema of a million values is refused as fast as one of five thousand.

    Returns:
        Each of its patterns (``pattern`` values and ``patternProperties`` keys), with where
        it first is.

    Raises:
        MalformedEvent: a bound is crossed (the message names it).
    """
    patterns: dict[str, str] = {}
    count = 1
    # (value, where, depth, whether the value stands where a schema does)
    stack: list[tuple[Any, str, int, bool]] = [(schema, "$", 1, True)]
    while stack:
        value, where, depth, is_schema = stack.pop()
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_SCHEMA_DEPTH:
            raise _too_many(f"it nests deeper than {MAX_SCHEMA_DEPTH} levels at {where}")
        count += len(value)
        if count > MAX_SCHEMA_VALUES:
            raise _too_many(f"it holds more than {MAX_SCHEMA_VALUES} values")
        if isinstance(value, list):
            stack.extend(
                (item, f"{where}[{i}]", depth + 1, is_schema) for i, item in enumerate(value)
            )
            continue
        for key, sub in value.items():
            at = f"{where}.{key}"
            if not is_schema or key in _DATA_KEYWORDS:
                enum = is_schema and key == "enum" and isinstance(sub, list)
                if enum and len(sub) > MAX_SCHEMA_ENUM:
                    raise _too_many(
                        f"the enum at {at} has {len(sub)} values; "
                        f"an enum may have at most {MAX_SCHEMA_ENUM}"
                    )
                stack.append((sub, at, depth + 1, False))
            elif key in _SCHEMA_MAPS and isinstance(sub, dict):
                count += len(sub)
                if count > MAX_SCHEMA_VALUES:
                    raise _too_many(f"it holds more than {MAX_SCHEMA_VALUES} values")
                if depth + 1 > MAX_SCHEMA_DEPTH:
                    raise _too_many(f"it nests deeper than {MAX_SCHEMA_DEPTH} levels at {at}")
                for name, member in sub.items():
                    if key == "patternProperties" and name not in patterns:
                        patterns[name] = at
                        _check_pattern(name, patterns[name])
                    stack.append((member, f"{at}.{name}", depth + 2, True))
            else:
                if key == "pattern" and isinstance(sub, str) and sub not in patterns:
                    patterns[sub] = at
                    _check_pattern(sub, at)
                stack.append((sub, at, depth + 1, True))
    return patterns


# Recursion: one frame per level; check_bounds holds a schema to MAX_SCHEMA_DEPTH levels.
def _prepared(schema: Any, patterns: dict[str, Any]) -> Any:
    """The schema as it is compiled: every sub-schema with ``required``/``properties`` and no
    ``type`` asks for an object; and no check of it runs a pattern through Python's ``re``.

    fastjsonschema itself matches each name that is ``required`` but not in ``properties``
    against ``patternProperties`` when ``additionalProperties`` is false (with ``re``, which
    backtracks). Here RE2 answers instead: a name some pattern covers is listed in
    ``properties`` with the empty schema (which changes nothing it accepts), a name none
    covers is refused as fastjsonschema would.

    Raises:
        MalformedEvent: a required name that no property or pattern allows.
    """
    if isinstance(schema, list):
        return [_prepared(item, patterns) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _prepared(sub, patterns) for name, sub in value.items()}
        else:
            out[key] = _prepared(value, patterns)
    if "type" not in out and ("required" in out or "properties" in out):
        out["type"] = "object"
    _cover_required(out, patterns)
    return out


def _cover_required(schema: dict, patterns: dict[str, Any]) -> None:
    required, by_pattern = schema.get("required"), schema.get("patternProperties")
    if not isinstance(required, list) or not isinstance(by_pattern, dict) or not by_pattern:
        return
    # fastjsonschema's own condition: any false value, `{}` too.
    if schema.get("additionalProperties", True):
        return
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return  # fastjsonschema refuses it with its own message
    covered = dict(properties)
    for name in required:
        if not isinstance(name, str) or name in covered:
            continue
        if not any(patterns[p].search(name) for p in by_pattern if p in patterns):
            raise MalformedEvent(
                f"not a usable JSON schema: {name!r} is required, but additionalProperties is "
                "false and no property or pattern allows it"
            )
        covered[name] = {}
    schema["properties"] = covered


class _NoRemoteRefs(dict):
    """Ref handlers that claim every URI scheme and resolve none of them.

    Without a handler fastjsonschema fetches a remote ``$ref`` with urlopen
    (http, file, ...): a schema from a run's log must never make a check do IO.
    """

    def __contains__(self, scheme: object) -> bool:
        return True

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return _refuse_remote_ref


def _refuse_remote_ref(uri: str) -> Any:
    raise fastjsonschema.JsonSchemaDefinitionException(f"remote $ref {uri!r} is not resolved")


def _compile(schema_bytes: bytes) -> Callable[[Any], Any]:
    """The check of a schema within bounds (its canonical text).

    Raises:
        MalformedEvent: it is not a usable schema.
    """
    raw = json.loads(schema_bytes)
    patterns = {p: _linear_pattern(p, where) for p, where in check_bounds(raw).items()}
    schema = _prepared(raw, patterns)
    try:
        check = fastjsonschema.compile(schema, handlers=_NoRemoteRefs())
    except Exception as exc:  # noqa: BLE001
        # fastjsonschema does not check a schema against its meta-schema, so a
        # malformed one fails in arbitrary ways (TypeError, re.error, ...):
        # every one of them means the schema is unusable.
        raise MalformedEvent(f"not a usable JSON schema: {exc}") from None
    # The generated check looks its regular expressions up by pattern in this table at each
    # call; the schema's own are swapped for RE2's, so a value is never matched by a
    # backtracking engine. (The table also holds fastjsonschema's fixed `format` expressions.)
    table = check.__globals__.get("REGEX_PATTERNS", {})
    for pattern in table.keys() & patterns.keys():
        table[pattern] = patterns[pattern]
    return check


class _CompiledSchemas:
    """Compiled checks by canonical schema text, least recently used first out, their texts
    together at most ``budget`` bytes. Safe to share between threads."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._weight = 0
        self._entries: OrderedDict[bytes, Callable[[Any], Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, schema_bytes: bytes) -> Callable[[Any], Any]:
        with self._lock:
            check = self._entries.get(schema_bytes)
            if check is not None:
                self._entries.move_to_end(schema_bytes)
                return check
        # Compiled outside the lock, so a slow compile holds up no other thread; two threads
        # compiling the same schema both get a working check, and one of them is kept.
        check = _compile(schema_bytes)
        with self._lock:
            if schema_bytes not in self._entries:
                self._entries[schema_bytes] = check
                self._weight += len(schema_bytes)
                while self._weight > self._budget and len(self._entries) > 1:
                    evicted, _ = self._entries.popitem(last=False)
                    self._weight -= len(evicted)
        return check

    def weight(self) -> int:
        """The bytes of schema text held now."""
        with self._lock:
            return self._weight


_COMPILED = _CompiledSchemas(SCHEMA_CACHE_BYTES)


class _RecentSchemas:
    """Checks by the schema object itself, for the schemas validated lately.

    A tool's schema is one object, validated at every call of the tool, and finding its check
    by canonical text (walking it for the bounds, then writing it out) costs more than the check
    itself. An entry keeps the schema, so its id is not reused while the entry lives, and a copy,
    so a schema changed in place since is looked up by its text again. The entries' texts are at
    most ``budget`` bytes together (then they are dropped at once), so the checks they keep
    compiled stay few beside ``_COMPILED``'s. Safe to share between threads.
    """

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._weight = 0
        self._entries: dict[int, tuple[Any, Any, int, Callable[[Any], Any]]] = {}
        self._lock = threading.Lock()

    def get(self, schema: Any) -> Callable[[Any], Any] | None:
        entry = self._entries.get(id(schema))
        if entry is not None and entry[0] is schema and entry[1] == schema:
            return entry[3]
        return None

    def put(self, schema: Any, size: int, check: Callable[[Any], Any]) -> None:
        if size > self._budget:
            return
        kept = copy.deepcopy(schema)
        with self._lock:
            stale = self._entries.pop(id(schema), None)
            self._weight -= 0 if stale is None else stale[2]
            if self._weight + size > self._budget:
                self._entries.clear()
                self._weight = 0
            self._entries[id(schema)] = (schema, kept, size, check)
            self._weight += size


_RECENT = _RecentSchemas(RECENT_SCHEMA_BYTES)


def schema_text(schema: Any) -> bytes:
    """The canonical text of a schema within this module's bounds (compiled or not).

    Raises:
        MalformedEvent: a bound is crossed (the message names it).
    """
    # The cheap bounds first: a schema of a million values is refused before it is even written
    # out as text.
    check_bounds(schema)
    schema_bytes = canonical_json(schema)
    if len(schema_bytes) > MAX_SCHEMA_BYTES:
        raise _too_many(
            f"its text is {len(schema_bytes)} bytes; a schema may have at most {MAX_SCHEMA_BYTES}"
        )
    return schema_bytes


def _compiled(schema: Any) -> Callable[[Any], Any]:
    check = _RECENT.get(schema)
    if check is None:
        text = schema_text(schema)
        check = _COMPILED.get(text)
        _RECENT.put(schema, len(text), check)
    return check


def check_schema(schema: Any) -> None:
    """Confirm a schema is within bounds and compiles.

    Costs at most a fraction of a second (see the bounds above); call it off an event loop.

    Raises:
        MalformedEvent: it is not an object, crosses a bound (named in the message), has a
            pattern RE2 cannot match, or is not a usable JSON schema.
    """
    if not isinstance(schema, dict):
        raise MalformedEvent("a JSON schema must be an object")
    _compiled(schema)


def validate(schema: dict, value: Any, *, what: str = "the input") -> None:
    """Check ``value`` against ``schema``.

    Its time grows with the value and the schema, never exponentially (patterns are RE2's).

    Raises:
        SchemaViolation: the value does not satisfy the schema; its
            ``violations`` list carries ``{"path", "message"}`` entries.
        MalformedEvent: the schema itself is unusable.
    """
    check = _compiled(schema)
    try:
        check(value)
    except fastjsonschema.JsonSchemaValueException as exc:
        # fastjsonschema names the failing value "data.items[1].id" (its
        # ``path`` list spells array indices as strings, so it cannot tell
        # [1] from .1); the name is the path with "data" for the root, and the
        # message opens with it.
        name = exc.name or "data"
        path = "$" + name[len("data") :] if name.startswith("data") else "$"
        message = path + exc.message[len(name) :] if exc.message.startswith(name) else exc.message
        raise SchemaViolation(
            f"{what} does not satisfy the recorded schema: {message}",
            violations=[{"path": path, "message": message}],
        ) from None
    except RecursionError:
        # A self-referential schema can recurse without end on some values.
        message = "the recorded schema recurses without end on this value"
        raise SchemaViolation(
            f"{what} could not be checked: {message}",
            violations=[{"path": "$", "message": message}],
        ) from None


def validate_budget_extension(value: Any) -> None:
    """Check a budget-exceeded run's resume input: ``{"extend_by": <number > 0>}``.

    Raises:
        SchemaViolation: the value is not that shape.
    """
    validate(BUDGET_EXTENSION_SCHEMA, value, what="a budget extension")
