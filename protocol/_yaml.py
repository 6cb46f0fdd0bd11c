"""YAML read strictly as JSON: the one way a YAML document a caller sent becomes a value.

Rules (``yaml.safe_load``, narrowed to what JSON can carry, so a YAML
document and its JSON twin are the same value and hash alike):
* A mapping key appears once; keys are strings.
* No timestamps or dates, binary, sets, ordered maps or pairs: each is
  refused, naming where it is (quote a date to keep it as text).
* No ``.inf`` or ``.nan``; no aliases and no merge keys (an alias shares
  one value between places, and a chain of them expands exponentially when
  the value is walked).
* Booleans are only ``true`` and ``false`` (any case pyyaml accepts for
  them); ``yes``, ``no``, ``on`` and ``off`` stay strings, so a branch's
  ``on:`` key is the text ``"on"``, not ``True``.
* A number with an exponent is a number as in JSON (``1e3``, ``2.5E-1``).
* One document per text.
* At most ``MAX_YAML_EVENTS`` events (each scalar, alias, and start and end of
  a sequence or mapping is one) and ``MAX_NESTING`` levels, counted by a first
  pass over the parser's events that builds nothing, so a text of a million
  small values is refused for a fraction of what loading it would cost.

Every refusal is a ``MalformedYaml`` whose message names the line and column
(1-based) where the problem is.
"""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar

import yaml

from ._error_codes import ErrorCode
from ._errors import ProtocolError
from ._strict_json import MAX_NESTING

# The events one YAML text may hold. A graph at its cap of nodes written out in YAML comes near
# it; loading this many takes about a second, off the daemon's event loop.
MAX_YAML_EVENTS = 200_000


class MalformedYaml(ProtocolError):
    """Text that is not a YAML document within the rules above (the sender's fault)."""

    code = ErrorCode.BAD_REQUEST


_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_REPLACED = frozenset({_BOOL_TAG, _FLOAT_TAG})
# Only true and false: YAML 1.1 also reads yes/no/on/off as booleans.
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
# pyyaml's YAML 1.1 floats need a dot and a signed exponent, so `1e3` would be the text "1e3"
# where JSON reads a number; these are JSON's numbers with a dot or an exponent, and the YAML 1.1
# forms pyyaml knows (1_000.5, sexagesimal 1:30.5, and .inf/.nan, which are then refused).
_FLOAT = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


def _refuse(what: str):
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        raise yaml.constructor.ConstructorError(
            None, None, f"{what} is not a JSON value; quote it to keep it as text", node.start_mark
        )

    return construct


class _StrictRules:
    """The rules of this module, over either of pyyaml's safe loaders (see ``_strict``)."""

    # The safe loader's implicit resolvers but its booleans and floats, which come back below.
    yaml_implicit_resolvers: ClassVar[dict] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _REPLACED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # An alias is the same node met a second time (libyaml's composer resolves aliases before
        # any Python sees them, so this is where both parsers can tell).
        if node in self.constructed_objects or node in self.recursive_objects:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "a value anchored here is used again through an alias (*name); write it out",
                node.start_mark,
            )
        return super().construct_object(node, deep=deep)

    def construct_yaml_map(self, node: yaml.MappingNode) -> Any:
        # As the safe loader's, and noting the line of each mapping: a graph error then names
        # the line of the node or edge it is about.
        data: dict = {}
        self.__dict__.setdefault("mapping_lines", {})[id(data)] = node.start_mark.line + 1
        yield data
        data.update(self.construct_mapping(node))

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        mapping: dict[str, Any] = {}
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(
                    None, None, "a merge key (<<) is not JSON", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a mapping key must be a string, not {key!r}", key_node.start_mark
                )
            if key in mapping:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} appears twice in one mapping (first on line {lines[key]})",
                    key_node.start_mark,
                )
            lines[key] = key_node.start_mark.line + 1
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_yaml_float(self, node: yaml.Node) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value} is not a JSON number", node.start_mark
            )
        return value


def _strict(base: type) -> type:
    """``base`` (a safe loader) with the rules of this module."""
    loader = type(f"Strict{base.__name__}", (_StrictRules, base), {})
    loader.add_implicit_resolver(_BOOL_TAG, _BOOL, list("tTfF"))
    loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))
    loader.add_constructor(_FLOAT_TAG, loader.construct_yaml_float)
    loader.add_constructor("tag:yaml.org,2002:map", loader.construct_yaml_map)
    for tag, what in (
        ("timestamp", "a timestamp or date"),
        ("binary", "binary data"),
        ("set", "a set"),
        ("omap", "an ordered map"),
        ("pairs", "a list of pairs"),
    ):
        loader.add_constructor(f"tag:yaml.org,2002:{tag}", _refuse(what))
    return loader


PURE_LOADER = _strict(yaml.SafeLoader)
# libyaml's parser (C) when pyyaml was built with it: several times faster on a large document;
# the construction, where every rule of this module is enforced, is the same Python either way.
LOADER = _strict(yaml.CSafeLoader) if getattr(yaml, "__with_libyaml__", False) else PURE_LOADER


def _where(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    if mark is None:
        return "somewhere in the text"
    return f"line {mark.line + 1}, column {mark.column + 1}"


def load_yaml(text: str, what: str = "the YAML document") -> Any:
    """The JSON value of a YAML text (see the module's rules).

    Raises:
        MalformedYaml: the text is not YAML, or breaks a rule; the message
            names the line and column.
    """
    return load_with(LOADER, text, what)[0]


def load_yaml_lines(text: str, what: str = "the YAML document") -> tuple[Any, dict[int, int]]:
    """``load_yaml``'s value, and the line (1-based) of each of its objects by ``id()``.

    The ids are those of the returned value's objects, so they hold while it lives.

    Raises:
        MalformedYaml: as ``load_yaml``.
    """
    return load_with(LOADER, text, what)


def _check_size(loader: type, text: str, what: str) -> None:
    """Refuse a text of more than ``MAX_YAML_EVENTS`` events or ``MAX_NESTING`` levels.

    A text the parser itself refuses passes here: loading it reports the error in full.

    Raises:
        MalformedYaml: a bound is crossed (the message names it and where).
    """
    reader = loader(text)
    events = depth = 0
    try:
        while reader.check_event():
            event = reader.get_event()
            events += 1
            if events > MAX_YAML_EVENTS:
                raise MalformedYaml(
                    f"{what} is too large: it holds more than {MAX_YAML_EVENTS} YAML values and "
                    f"collection ends (the limit), at line {event.start_mark.line + 1}"
                )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:
                    mark = event.start_mark
                    raise MalformedYaml(
                        f"{what} nests too deeply: more than {MAX_NESTING} levels at line "
                        f"{mark.line + 1}, column {mark.column + 1}"
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return
    finally:
        reader.dispose()


def load_with(loader: type, text: str, what: str) -> tuple[Any, dict[int, int]]:
    """``load_yaml_lines`` through one of this module's loaders (``LOADER`` or ``PURE_LOADER``)."""
    if loader not in (LOADER, PURE_LOADER):
        raise ValueError("load_with takes one of this module's strict loaders")
    _check_size(loader, text, what)
    reader = loader(text)
    try:
        value = reader.get_single_data()
        return value, reader.__dict__.get("mapping_lines", {})
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or exc.context or "it cannot be read"
        raise MalformedYaml(f"{what} is not valid at {_where(exc)}: {problem}") from None
    except yaml.YAMLError as exc:
        raise MalformedYaml(f"{what} cannot be read: {exc}") from None
    except RecursionError:
        raise MalformedYaml(f"{what} is nested too deeply") from None
    finally:
        reader.dispose()
