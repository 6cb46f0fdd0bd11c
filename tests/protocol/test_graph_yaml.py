"""YAML graph documents: read strictly as JSON, every refusal naming its line and column."""

from __future__ import annotations

import pytest
from salvor.protocol import InvalidGraph, MalformedYaml, load_yaml, parse_graph_yaml

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
        ("a: &x 1\nb: *x\n", "line 1, column 4: an anchor (&x) is not allowed"),
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
