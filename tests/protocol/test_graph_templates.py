"""References, the reducers of a fold, and how a branch picks its case."""

from __future__ import annotations

import pytest
from salvor.protocol import (
    MISSING,
    Reference,
    ReferenceRoot,
    TemplateError,
    fold_values,
    graph_from_value,
    parse_reference,
    pick_case,
    references,
    resolve_template,
)

from tests.protocol.graphs import node_of, publishing

RUN_INPUT = {"topic": "otters", "tickets": [{"id": "T-1"}, {"id": "T-2", "tags": ["a", "b"]}]}
OUTPUTS = {"research": {"notes": ["n0", "n1"], "count": 2}, "approve": {"approved": True}}


def resolve(template, **scope):
    return resolve_template(template, run_input=RUN_INPUT, outputs=OUTPUTS, **scope)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("$input", RUN_INPUT),
        ("$input.topic", "otters"),
        ("$input.tickets.1.tags.0", "a"),
        ("$nodes.research", OUTPUTS["research"]),
        ("$nodes.research.notes.1", "n1"),
        ("$nodes.approve.approved", True),
        # Escapes: $$ at the start is one literal $; a $ later in a string is plain text.
        ("$$input", "$input"),
        ("$$$nodes", "$$nodes"),
        ("costs $5", "costs $5"),
        ("", ""),
        # No interpolation inside a longer string: it is a reference or it is not.
        ("topic: $input.topic", "topic: $input.topic"),
        # Recursion into objects and lists; keys are never references; scalars stay.
        (
            {"$input": ["$input.topic", 3, None, {"n": "$nodes.research.count"}]},
            {"$input": ["otters", 3, None, {"n": 2}]},
        ),
        (True, True),
    ],
)
def test_resolve_replaces_every_reference_and_nothing_else(template, expected) -> None:
    assert resolve(template) == expected


def test_item_and_index_resolve_inside_a_map_body_only() -> None:
    template = {"ticket": "$item.id", "n": "$index", "whole": "$item"}
    assert resolve(template, item={"id": "T-9"}, index=3) == {
        "ticket": "T-9",
        "n": 3,
        "whole": {"id": "T-9"},
    }
    # A null item is an item.
    assert resolve("$item", item=None, index=0) is None
    with pytest.raises(TemplateError, match=r"\$item: there is no map item here"):
        resolve("$item", item=MISSING)
    with pytest.raises(TemplateError, match=r"\$index: there is no map index here"):
        resolve("$index")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("$input.author", r"\$input.author: 'author' is not in the data"),
        ("$input.tickets.2", r"'2' is not in the data \(under tickets, a list of 2\)"),
        ("$input.topic.0", r"'0' is not in the data \(under topic, a str\)"),
        ("$input.tickets.x", r"'x' is not in the data"),
        ("$nodes.draft", r"node 'draft' has no recorded output"),
        ("$nodes.research.notes.-1", r"'-1' is not in the data"),
        ({"deep": ["$nodes.approve.reason"]}, r"'reason' is not in the data"),
        ("$inputs", r"starts with neither"),
        ("$input..x", r"empty path segment"),
        ("$nodes", r"names no node"),
        ("$index.0", r"reads a path of \$index"),
    ],
)
def test_a_reference_to_data_that_is_not_there_is_a_template_error(template, message) -> None:
    with pytest.raises(TemplateError, match=message):
        resolve(template, item=1, index=0)


def test_a_digit_segment_is_a_key_of_an_object() -> None:
    assert resolve_template("$input.7", run_input={"7": "seven"}, outputs={}) == "seven"


def test_references_lists_every_reference_in_document_order() -> None:
    template = {"a": ["$input.x", "$$not", {"b": "$nodes.n.0"}], "c": "$item", "d": "$index"}
    assert references(template) == [
        Reference(text="$input.x", root=ReferenceRoot.INPUT, node=None, path=("x",)),
        Reference(text="$nodes.n.0", root=ReferenceRoot.NODES, node="n", path=("0",)),
        Reference(text="$item", root=ReferenceRoot.ITEM, node=None, path=()),
        Reference(text="$index", root=ReferenceRoot.INDEX, node=None, path=()),
    ]
    assert parse_reference("$nodes.draft").node == "draft"
    with pytest.raises(TemplateError):
        references(["$nope"])


ITEMS = [{"minutes": 3, "tags": ["a"], "who": {"x": 1}}, {"minutes": 4.5, "tags": [], "who": {}}]


@pytest.mark.parametrize(
    ("reducer", "items", "field", "expected"),
    [
        ("sum", [1, 2, 3.5], None, 6.5),
        ("sum", ITEMS, "minutes", 7.5),
        ("sum", [], None, 0),
        ("count", ITEMS, None, 2),
        ("count", [], None, 0),
        ("concat", [[1], [], [2, 3]], None, [1, 2, 3]),
        ("concat", ["ab", "", "c"], None, "abc"),
        ("concat", ITEMS, "tags", ["a"]),
        ("concat", [], None, []),
        ("merge", [{"a": 1, "b": 1}, {"b": 2}], None, {"a": 1, "b": 2}),
        ("merge", ITEMS, "who", {"x": 1}),
        ("merge", [], None, {}),
        ("collect", ITEMS, "minutes", [3, 4.5]),
        ("collect", [None, 1], None, [None, 1]),
        ("sum", [{"a": {"b": [5]}}, {"a": {"b": [6]}}], "a.b.0", 11),
    ],
)
def test_every_reducer(reducer, items, field, expected) -> None:
    assert fold_values(reducer, items, field) == expected


@pytest.mark.parametrize(
    ("reducer", "items", "field", "message"),
    [
        ("sum", [1, "2"], None, "sum needs numbers"),
        ("sum", [True, 1], None, "sum needs numbers"),
        ("concat", [[1], "a"], None, "concat needs all lists or all strings"),
        ("concat", [1], None, "concat needs all lists or all strings"),
        ("merge", [{}, []], None, "merge needs objects"),
        ("count", {"a": 1}, None, "a fold reads a list, not an object"),
        ("collect", ITEMS, "hours", "item 0, field 'hours'"),
        ("average", [1], None, "'average' is not a reducer"),
    ],
)
def test_a_shape_a_reducer_cannot_reduce_is_a_template_error(reducer, items, field, message):
    with pytest.raises(TemplateError, match=message):
        fold_values(reducer, items, field)


def _branch(cases: list[str], default: str | None = None):
    document = publishing()
    route = node_of(document, "route")
    route["cases"] = cases
    if default is None:
        route.pop("default")
    else:
        route["default"] = default
    document["edges"] = [e for e in document["edges"] if e["from"] != "route"]
    document["edges"] += [{"from": "route", "to": "publish", "case": case} for case in cases]
    document["nodes"].remove(node_of(document, "cool_off"))
    return graph_from_value(document).node("route")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("refund", "refund"),
        (True, "true"),
        (False, "false"),
        (None, "null"),
        (3, "3"),
        (3.0, "3"),  # numbers compare by their RFC 8785 text
        (2.5, "2.5"),
        ("True", "other"),  # strings compare exactly
        ("escalate", "other"),  # no match: the default
        ([1], "other"),  # lists and objects match no case
        ({"true": 1}, "other"),
    ],
)
def test_pick_case_matches_the_value_text_else_the_default(value, expected) -> None:
    node = _branch(["refund", "true", "false", "null", "3", "2.5", "other"], default="other")
    assert pick_case(node, value) == expected


def test_pick_case_without_a_match_or_a_default_names_the_node_and_the_value() -> None:
    node = _branch(["true", "false"])
    assert pick_case(node, True) == "true"
    with pytest.raises(TemplateError, match=r"branch 'route': the value \"maybe\" matches none"):
        pick_case(node, "maybe")
