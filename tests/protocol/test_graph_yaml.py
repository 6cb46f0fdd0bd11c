"""YAML graph documents: read strictly as JSON, every refusal naming its line and column."""

from __future__ import annotations

import pytest
from salvor.protocol import InvalidGraph, MalformedYaml, check_graph, load_yaml, parse_graph_yaml
from salvor.protocol._yaml import LOADER, MAX_YAML_EVENTS, PURE_LOADER, load_with

BRANCH = """\
schema_version: 1
nodes:
  - {id: ask, kind: gate, prompt: "Go on?"}
  - id: route
    kind: branch
    on: $nodes.ask.go
    cases: [yes, no, on, off]
  - {id: go, kind: tool, tool: echo}
edges:
  - {from: ask, to: route}
  - {from: route, to: go, case: yes}
  - {from: route, to: go, case: no}
  - {from: route, to: go, case: on}
  - {from: route, to: go, case: off}
"""


def test_yes_no_on_and_off_are_strings_so_a_branch_on_key_reads() -> None:
    graph = parse_graph_yaml(BRANCH)
    route = graph.node("route")
    assert route.on == "$nodes.ask.go"
    assert route.cases == ("yes", "no", "on", "off")
    assert load_yaml("[true, false, True, FALSE, null, ~, 1, 2.5, -3e2, 0x10, 1.5E-1, 1_0]") == [
        True,
        False,
        True,
        False,
        None,
        None,
        1,
        2.5,
        -300.0,
        16,
        0.15,
        10,
    ]
    assert load_yaml("[yes, no, on, off, '1e3', 1e, e3, 1.2.3]") == [
        "yes",
        "no",
        "on",
        "off",
        "1e3",
        "1e",
        "e3",
        "1.2.3",
    ]


def malformed(text: str | bytes) -> str:
    with pytest.raises(InvalidGraph) as caught:
        parse_graph_yaml(text)
    [error] = caught.value.errors
    assert error.code == "malformed_document"
    return error.message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "schema_version: 1\nnodes: []\nschema_version: 1\n",
            (
                "line 3, column 1: the key 'schema_version' appears twice in one mapping "
                "(first on line 1)"
            ),
        ),
        (
            "a:\n  - {b: 1, c: 2, b: 3}\n",
            "line 2, column 18: the key 'b' appears twice",
        ),
        ("at: 2030-01-01T00:00:00Z\n", "line 1, column 5: a timestamp or date is not a JSON value"),
        ("x:\n  day: 2030-01-01\n", "line 2, column 8: a timestamp or date"),
        ("x: !!binary aGk=\n", "line 1, column 4: binary data is not a JSON value"),
        ("x: !!set {a, b}\n", "line 1, column 4: a set is not a JSON value"),
        ("x: !!omap [a: 1]\n", "line 1, column 4: an ordered map"),
        ("x: !!pairs [a: 1]\n", "line 1, column 4: a list of pairs"),
        ("x: .inf\n", "line 1, column 4: .inf is not a JSON number"),
        ("x: [1, -.Inf]\n", "line 1, column 8: -.Inf is not a JSON number"),
        ("x: .nan\n", "line 1, column 4: .nan is not a JSON number"),
        ("1: a\n", "line 1, column 1: a mapping key must be a string, not 1"),
        ("x:\n  true: a\n", "line 2, column 3: a mapping key must be a string, not True"),
        ("? [a]\n: b\n", "line 1, column 3: a mapping key must be a string"),
        ("a: &x 1\nb: *x\n", "line 1, column 4: a value anchored here is used again"),
        ("a: &x [1]\nb: [*x, *x]\n", "line 1, column 4: a value anchored here is used again"),
        ("a: {b: 1}\nc: {<<: {b: 2}}\n", "line 2, column 5: a merge key (<<) is not JSON"),
        ("a: *x\n", "line 1, column 4"),
        ("x: !!python/object:os.system ls\n", "line 1, column 4"),
        ("a: [1, 2\nb: 3\n", "line 2, column 2"),
        ("a: 'open\n", "line 2, column 1"),
        ("\tx: 1\n", "line 1, column 1"),
        ("a: 1\n---\nb: 2\n", "line 2, column 1: but found another document"),
    ],
)
def test_yaml_outside_json_is_refused_at_its_line_and_column(text: str, message: str) -> None:
    found = malformed(text)
    assert found.startswith("the graph document is not valid at line ")
    assert message in found
    # The same place whichever parser pyyaml has: libyaml's (when built with it) or its own
    # (a syntax error's wording is each parser's own; the rules' refusals are the same text).
    for loader in (LOADER, PURE_LOADER):
        with pytest.raises(MalformedYaml) as caught:
            load_with(loader, text, "the graph document")
        assert caught.value.message.split(": ")[0] == found.split(": ")[0]
        assert message.partition(": ")[2] in caught.value.message


def test_both_loaders_read_a_graph_alike() -> None:
    assert load_with(PURE_LOADER, BRANCH, "it")[0] == load_with(LOADER, BRANCH, "it")[0]
    assert load_with(PURE_LOADER, "a: &unused 1\n", "it")[0] == {"a": 1}


DEFECTIVE = """\
schema_version: 1
nodes:
  - {id: ask, kind: gate, prompt: "Go on?"}
  - id: route
    kind: branch
    on: $nodes.ask.go
    cases: [yes, no]
    name: "   "
  - {id: go, kind: tool, tool: echo, input: $nodes.og}
  - {id: ask, kind: tool, tool: echo}
edges:
  - {from: ask, to: route}
  - {from: route, to: go, case: yes}
  - from: route
    to: gone
    case: no
"""


def test_a_yaml_document_s_errors_name_the_line_of_their_node_or_edge() -> None:
    with pytest.raises(InvalidGraph) as caught:
        parse_graph_yaml(DEFECTIVE)
    placed = [(e["code"], e.get("node"), e.get("line")) for e in caught.value.details["errors"]]
    assert placed == [
        ("blank_node_name", "route", 4),
        ("duplicate_node_id", "ask", 10),
        ("dangling_edge", None, 14),
        ("missing_case_edge", "route", 4),
        ("unknown_reference", "go", 9),
    ]
    # JSON carries no lines: the same document read as a value has none.
    assert all(error.line is None for error in check_graph(load_yaml(DEFECTIVE)))


def test_what_strict_json_refuses_yaml_cannot_carry_either() -> None:
    assert "outside ±9007199254740991" in malformed("x: 1152921504606846976\n")
    assert "NUL character" in malformed('x: "\\0"\n')
    assert "nests" in malformed("x: " + "[" * 130 + "]" * 130 + "\n")
    assert "byte-order mark" in malformed(b"\xef\xbb\xbfx: 1\n")
    assert "must be an object, not null" in malformed("")
    assert "must be an object, not a list" in malformed("- 1\n")


def test_the_loader_raises_its_own_error_for_other_callers() -> None:
    with pytest.raises(MalformedYaml, match="the settings is not valid at line 1, column 5"):
        load_yaml("a: b: c\n", "the settings")


def test_a_yaml_text_of_too_many_events_is_refused_before_it_is_built() -> None:
    many = "x: [" + ", ".join("1" for _ in range(MAX_YAML_EVENTS)) + "]\n"
    with pytest.raises(MalformedYaml) as caught:
        load_yaml(many, "the graph document")
    assert caught.value.message.startswith("the graph document is too large")
    assert f"more than {MAX_YAML_EVENTS} YAML values" in caught.value.message
    assert "too large" in malformed(many)
    load_yaml("x: [" + ", ".join("1" for _ in range(MAX_YAML_EVENTS - 10)) + "]\n")
