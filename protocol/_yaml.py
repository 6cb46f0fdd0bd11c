"""YAML read strictly as JSON: the one way a YAML document a caller sent becomes a value.

Rules (``yaml.safe_load``, narrowed to what JSON can carry, so a YAML
document and its JSON twin are the same value and hash alike):
* A mapping key appears once; keys are strings.
* No timestamps or dates, binary, sets, ordered maps or pairs: each is
  refused, naming where it is (quote a date to keep it as text).
* No ``.inf`` or ``.nan``; no anchors or aliases (an alias shares one
  value between places, and a chain of them expands exponentially when the
  value is walked).
* Booleans are only ``true`` and ``false`` (any case pyyaml accepts for
  them); ``yes``, ``no``, ``on`` and ``off`` stay strings, so a branch's
  ``on:`` key is the text ``"on"``, not ``True``.
* A number with an exponent is a number as in JSON (``1e3``, ``2.5E-1``).
* One document per text.

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


class _StrictLoader(yaml.SafeLoader):
    """pyyaml's safe loader with the rules of this module."""

    # The safe loader's implicit resolvers but its booleans and floats, which come back below.
    yaml_implicit_resolvers: ClassVar[dict] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _REPLACED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "an alias (*name) is not allowed", event.start_mark
            )
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise yaml.composer.ComposerError(
                None, None, f"an anchor (&{anchor}) is not allowed", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a mapping key must be a string, not {key!r}", key_node.start_mark
                )
            if key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} appears twice in one mapping (first on line {first})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_float(self, node: yaml.Node) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value} is not a JSON number", node.start_mark
            )
        return value


_StrictLoader.add_implicit_resolver(_BOOL_TAG, _BOOL, list("tTfF"))
_StrictLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))
_StrictLoader.add_constructor(_FLOAT_TAG, _StrictLoader.construct_yaml_float)
for _tag, _what in (
    ("timestamp", "a timestamp or date"),
    ("binary", "binary data"),
    ("set", "a set"),
    ("omap", "an ordered map"),
    ("pairs", "a list of pairs"),
):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse(_what))


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
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or exc.context or "it cannot be read"
        raise MalformedYaml(f"{what} is not valid at {_where(exc)}: {problem}") from None
    except yaml.YAMLError as exc:
        raise MalformedYaml(f"{what} cannot be read: {exc}") from None
    except RecursionError:
        raise MalformedYaml(f"{what} is nested too deeply") from None
