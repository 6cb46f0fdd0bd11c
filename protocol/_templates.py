"""References inside a graph node's templates, and the pure data steps of a graph run.

Rules:
* A template is any JSON value. A string that begins with ``$`` is a
  reference and is replaced by the value it names; ``$$`` at the start
  stands for a literal ``$`` (``"$$5"`` is the text ``"$5"``). Nothing is
  interpolated inside a longer string, and object keys are never references.
* The forms: ``$input``, ``$input.<path>``, ``$nodes.<id>``,
  ``$nodes.<id>.<path>``, and inside a map body ``$item``, ``$item.<path>``,
  ``$index``. A path is dot-separated segments; a segment of digits indexes
  a list (on an object it is an ordinary key).
* Everything here is a pure function of its arguments: the engine calls them
  while walking a graph, validation calls ``parse_reference`` to check a
  document before any run exists.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._canonical import canonical_json
from ._error_codes import ErrorCode
from ._errors import ProtocolError, excerpt


class TemplateError(ProtocolError):
    """A reference that does not read as one of the forms, or names data that is not there.

    At validation time a malformed reference is reported as a graph error;
    at run time this fails the run, naming the node and the reference.
    """

    code = ErrorCode.BAD_REQUEST


class _Missing(enum.Enum):
    MISSING = "MISSING"


# The value of ``item`` when no map item is in scope (None is a legal item).
MISSING = _Missing.MISSING


class ReferenceRoot(enum.StrEnum):
    """What a reference starts from."""

    INPUT = "input"
    NODES = "nodes"
    ITEM = "item"
    INDEX = "index"


_ROOTS = {str(root): root for root in ReferenceRoot}
# Roots that only mean something inside a map's body.
MAP_ROOTS = frozenset({ReferenceRoot.ITEM, ReferenceRoot.INDEX})


@dataclass(frozen=True, slots=True)
class Reference:
    """One parsed reference: ``text`` as written, its root, the node it names, its path."""

    text: str
    root: ReferenceRoot
    node: str | None
    path: tuple[str, ...]


def is_reference(value: Any) -> bool:
    """True for a string a template reads as a reference (``$...`` but not ``$$...``)."""
    return isinstance(value, str) and value.startswith("$") and not value.startswith("$$")


def parse_reference(text: str) -> Reference:
    """The reference ``text`` spells.

    Raises:
        TemplateError: it is not one of the forms (an unknown root, an empty
            segment, ``$nodes`` without an id, a path after ``$index``).
    """
    if not is_reference(text):
        raise TemplateError(f"{excerpt(text)!r} is not a reference (one starts with `$`)")
    root_text, *segments = text[1:].split(".")
    if any(segment == "" for segment in segments):
        raise TemplateError(f"the reference {excerpt(text)!r} has an empty path segment")
    root = _ROOTS.get(root_text)
    if root is None:
        raise TemplateError(
            f"the reference {excerpt(text)!r} starts with neither $input, $nodes, $item nor $index"
        )
    node = None
    if root is ReferenceRoot.NODES:
        if not segments:
            raise TemplateError(f"the reference {excerpt(text)!r} names no node ($nodes.<id>)")
        node, *segments = segments
    elif root is ReferenceRoot.INDEX and segments:
        raise TemplateError(f"the reference {excerpt(text)!r} reads a path of $index, a number")
    return Reference(text=text, root=root, node=node, path=tuple(segments))


def reference_strings(template: Any) -> list[str]:
    """Every string of ``template`` that reads as a reference, in document order."""
    if isinstance(template, str):  # most templates are one reference: no walk for them
        return [template] if is_reference(template) else []
    found = []
    stack = [template]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if value.startswith("$") and not value.startswith("$$"):
                found.append(value)
        elif isinstance(value, dict):
            stack.extend(reversed(value.values()))
        elif isinstance(value, list):
            stack.extend(reversed(value))
    return found


def references(template: Any) -> list[Reference]:
    """Every reference of ``template``, parsed, in document order.

    Raises:
        TemplateError: one of them is not a reference form.
    """
    return [parse_reference(text) for text in reference_strings(template)]


def read_path(value: Any, path: tuple[str, ...], what: str) -> Any:
    """The value at ``path`` inside ``value``; ``what`` names the reference in a refusal.

    Raises:
        TemplateError: a segment names a key or an index that is not there.
    """
    for depth, segment in enumerate(path):
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            at = ".".join(path[:depth]) or "the value itself"
            raise TemplateError(
                f"{what}: {excerpt(segment, 32)!r} is not in the data (under {at}, "
                f"{_describe(value)})"
            )
    return value


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"an object with {len(value)} key(s)"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return "null" if value is None else f"a {type(value).__name__}"


def _resolve_reference(
    reference: Reference, run_input: Any, outputs: Mapping[str, Any], item: Any, index: int | None
) -> Any:
    if reference.root is ReferenceRoot.INPUT:
        start = run_input
    elif reference.root is ReferenceRoot.NODES:
        if reference.node not in outputs:
            raise TemplateError(f"{reference.text}: node {reference.node!r} has no recorded output")
        start = outputs[reference.node]
    elif reference.root is ReferenceRoot.ITEM:
        if item is MISSING:
            raise TemplateError(f"{reference.text}: there is no map item here")
        start = item
    else:
        if index is None:
            raise TemplateError(f"{reference.text}: there is no map index here")
        return index
    return read_path(start, reference.path, reference.text)


# Recursion: as reference_strings' (a template is at most MAX_NESTING levels deep).
def resolve_template(
    template: Any,
    *,
    run_input: Any,
    outputs: Mapping[str, Any],
    item: Any = MISSING,
    index: int | None = None,
) -> Any:
    """``template`` with every reference replaced by the value it names.

    ``outputs`` maps a node id to its recorded output; ``item`` and ``index``
    are the map item in scope (inside a map body). The result shares the
    referenced values with ``outputs`` and ``run_input``: do not mutate it.

    Raises:
        TemplateError: a reference is not a form, or names a node without an
            output, a path that is not in the data, or a map item out of scope.
    """
    if isinstance(template, str):
        if template.startswith("$$"):
            return template[1:]
        if template.startswith("$"):
            return _resolve_reference(parse_reference(template), run_input, outputs, item, index)
        return template
    if isinstance(template, dict):
        return {
            key: resolve_template(
                value, run_input=run_input, outputs=outputs, item=item, index=index
            )
            for key, value in template.items()
        }
    if isinstance(template, list):
        return [
            resolve_template(value, run_input=run_input, outputs=outputs, item=item, index=index)
            for value in template
        ]
    return template


class Reducer(enum.StrEnum):
    """How a fold node reduces a list."""

    SUM = "sum"
    COUNT = "count"
    CONCAT = "concat"
    MERGE = "merge"
    COLLECT = "collect"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _reduce(reducer: Reducer, values: list) -> Any:
    if reducer is Reducer.COUNT:
        return len(values)
    if reducer is Reducer.COLLECT:
        return values
    if reducer is Reducer.SUM:
        if not all(_is_number(value) for value in values):
            raise TemplateError("sum needs numbers, and an item is not one")
        return sum(values)
    if reducer is Reducer.CONCAT:
        if all(isinstance(value, list) for value in values):
            return [element for value in values for element in value]
        if all(isinstance(value, str) for value in values):
            return "".join(values)
        raise TemplateError("concat needs all lists or all strings")
    if not all(isinstance(value, dict) for value in values):
        raise TemplateError("merge needs objects, and an item is not one")
    merged: dict = {}
    for value in values:
        merged.update(value)
    return merged


def fold_values(reducer: str, items: list, field: str | None) -> Any:
    """Reduce ``items`` (first reading ``field``, a dotted path, from each) with ``reducer``.

    ``sum`` of no items is 0, ``concat`` of none is ``[]``, ``merge`` of none is ``{}``.

    Raises:
        TemplateError: ``items`` is not a list, an item lacks ``field``, or a
            value is of a shape the reducer cannot reduce (or the reducer is unknown).
    """
    try:
        chosen = Reducer(reducer)
    except ValueError:
        raise TemplateError(f"{excerpt(reducer, 32)!r} is not a reducer") from None
    if not isinstance(items, list):
        raise TemplateError(f"a fold reads a list, not {_describe(items)}")
    values = items
    if field is not None:
        path = tuple(field.split("."))
        values = [
            read_path(item, path, f"item {index}, field {field!r}")
            for index, item in enumerate(items)
        ]
    try:
        return _reduce(chosen, values)
    except TemplateError as exc:
        raise TemplateError(f"{chosen}: {exc.message}") from None


def case_text(value: Any) -> str | None:
    """The text a branch compares with its cases: a string as is, a scalar as its JSON text.

    Lists and objects have none (they never match a case).
    """
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return canonical_json(value).decode("utf-8")
    return None


def pick_case(node: Any, value: Any) -> str:
    """The case a branch ``node`` takes for ``value``: the equal case, else its default.

    Raises:
        TemplateError: no case equals the value and the branch has no default.
    """
    text = case_text(value)
    if text is not None and text in node.cases:
        return text
    if node.default is not None:
        return node.default
    shown = excerpt(canonical_json(value).decode("utf-8"), 64)
    raise TemplateError(
        f"branch {node.id!r}: the value {shown} matches none of its cases and it has no default"
    )
