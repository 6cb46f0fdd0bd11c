"""Validation of graph documents: one document per defect, each code exact, and all at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from salvor.protocol import InvalidGraph, check_graph, graph_from_value, parse_graph_json
from salvor.protocol._suggestions import DIFFLIB_CHOICES, MAX_SUGGESTIONS

from tests.protocol.graphs import AGENT, chain, node_of, publishing


def _edit(change: Callable[[dict], Any]) -> dict:
    document = publishing()
    change(document)
    return document


def _add_node(node: dict) -> Callable[[dict], Any]:
    return lambda document: document["nodes"].append(node)


def _add_edge(source: str, target: str, case: str | None = None) -> Callable[[dict], Any]:
    edge = {"from": source, "to": target} | ({"case": case} if case is not None else {})
    return lambda document: document["edges"].append(edge)


def _set(node_id: str, **fields: Any) -> Callable[[dict], Any]:
    def change(document: dict) -> None:
        node = node_of(document, node_id)
        for name, value in fields.items():
            if value is _DROP:
                node.pop(name)
            else:
                node[name] = value

    return change


_DROP = object()


def found(document: Any) -> list[tuple]:
    """(code, node, edge, suggestion, extra) of every error (the message is checked to be text)."""
    summary = []
    for error in check_graph(document):
        body = error.to_json()
        assert body.pop("code") == error.code and isinstance(body.pop("message"), str)
        summary.append(
            (
                error.code,
                body.pop("node", None),
                tuple(body.pop("edge").values()) if "edge" in body else None,
                body.pop("suggestion"),
                body,
            )
        )
    return summary


# (name, document, the one error expected: code, node, edge, suggestion, extra fields)
DEFECTS = [
    (
        "duplicate_node_id",
        _edit(_add_node({"id": "draft", "kind": "tool", "tool": "echo"})),
        ("duplicate_node_id", "draft", None, None, {"index": 8}),
    ),
    (
        "invalid_node_id",
        _edit(_add_node({"id": "9lives", "kind": "tool", "tool": "echo"})),
        ("invalid_node_id", "9lives", None, None, {}),
    ),
    (
        "invalid_node_id (too long)",
        _edit(_add_node({"id": "n" * 65, "kind": "tool", "tool": "echo"})),
        ("invalid_node_id", "n" * 65, None, None, {}),
    ),
    (
        "dangling_edge (target misspelt)",
        _edit(_add_edge("draft", "publsh")),
        ("dangling_edge", None, ("draft", "publsh"), "publish", {"missing": "publsh"}),
    ),
    (
        "dangling_edge (nothing near)",
        _edit(_add_edge("zzzzzz", "draft")),
        ("dangling_edge", None, ("zzzzzz", "draft"), None, {"missing": "zzzzzz"}),
    ),
    (
        "duplicate_edge",
        _edit(_add_edge("research", "draft")),
        ("duplicate_edge", None, ("research", "draft"), None, {}),
    ),
    (
        "self_edge",
        _edit(_add_edge("tally", "tally")),
        ("self_edge", None, ("tally", "tally"), None, {}),
    ),
    (
        "cycle",
        _edit(_add_edge("tally", "each")),
        ("cycle", "each", None, None, {"nodes": ["each", "tally"]}),
    ),
    (
        "unreachable_node",
        {
            "schema_version": 1,
            "nodes": [{"id": i, "kind": "tool", "tool": "echo"} for i in ("a", "b", "c", "d")],
            "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}, {"from": "b", "to": "c"}],
        },
        None,  # two errors: see test_a_node_fed_only_by_a_cycle_is_unreachable
    ),
    (
        "missing_case_edge",
        _edit(lambda d: d["edges"].pop(4)),
        ("missing_case_edge", "route", None, None, {"case": "false"}),
    ),
    (
        "unknown_case (edge)",
        _edit(lambda d: d["edges"][4].update(case="flase")),
        [
            ("unknown_case", None, ("route", "cool_off"), "false", {"case": "flase"}),
            ("missing_case_edge", "route", None, None, {"case": "false"}),
        ],
    ),
    (
        "unknown_case (default)",
        _edit(_set("route", default="maybe")),
        ("unknown_case", "route", None, None, {"case": "maybe"}),
    ),
    (
        "case_on_non_branch",
        _edit(lambda d: d["edges"][0].update(case="true")),
        ("case_on_non_branch", None, ("research", "draft"), None, {"case": "true"}),
    ),
    (
        "branch_edge_without_case",
        _edit(_add_edge("route", "each")),
        ("branch_edge_without_case", None, ("route", "each"), None, {}),
    ),
    (
        "map_without_body",
        _edit(_set("each", body=_DROP)),
        ("map_without_body", "each", None, None, {}),
    ),
    (
        "invalid_map_body (a gate)",
        _edit(_set("each", body={"kind": "gate", "prompt": "ok?"})),
        ("invalid_map_body", "each", None, None, {}),
    ),
    (
        "invalid_map_body (an id)",
        _edit(_set("each", body={"id": "x", "kind": "tool", "tool": "echo"})),
        ("invalid_map_body", "each", None, None, {}),
    ),
    (
        "invalid_map_body (its own field wrong)",
        _edit(_set("each", body={"kind": "agent", "agent": "sha1:abc"})),
        ("invalid_map_body", "each", None, None, {}),
    ),
    (
        "invalid_map_body (not an object)",
        _edit(_set("each", body="$item")),
        ("invalid_map_body", "each", None, None, {}),
    ),
    (
        "node_name_too_long",
        _edit(_set("draft", name="d" * 65)),
        ("node_name_too_long", "draft", None, None, {"length": 65, "max": 64}),
    ),
    (
        "blank_node_name",
        _edit(_set("draft", name=" \t")),
        ("blank_node_name", "draft", None, None, {}),
    ),
    (
        "blank_node_name (empty)",
        _edit(_set("draft", name="")),
        ("blank_node_name", "draft", None, None, {}),
    ),
    (
        "unknown_reference (a misspelt node)",
        _edit(_set("publish", input={"text": ["$nodes.drfat.body"]})),
        ("unknown_reference", "publish", None, "draft", {"reference": "$nodes.drfat.body"}),
    ),
    (
        "unknown_reference (a misspelt root)",
        _edit(_set("research", input="$inptu.topic")),
        ("unknown_reference", "research", None, "$input.topic", {"reference": "$inptu.topic"}),
    ),
    (
        "unknown_reference (no such form)",
        _edit(_set("research", input="$input..topic")),
        ("unknown_reference", "research", None, None, {"reference": "$input..topic"}),
    ),
    (
        "unknown_reference (in a branch's on)",
        _edit(_set("route", on="$nodes.aprove.approved")),
        ("unknown_reference", "route", None, "approve", {"reference": "$nodes.aprove.approved"}),
    ),
    (
        "reference_not_upstream (downstream)",
        _edit(_set("draft", input="$nodes.publish")),
        ("reference_not_upstream", "draft", None, None, {"reference": "$nodes.publish"}),
    ),
    (
        "reference_not_upstream (a sibling)",
        _edit(_set("tally", over="$nodes.research")),
        ("reference_not_upstream", "tally", None, None, {"reference": "$nodes.research"}),
    ),
    (
        "reference_not_upstream (itself)",
        _edit(_set("research", input="$nodes.research")),
        ("reference_not_upstream", "research", None, None, {"reference": "$nodes.research"}),
    ),
    (
        "reference_not_upstream (in a map body)",
        _edit(_set("each", body={"kind": "tool", "tool": "t", "input": ["$item", "$nodes.tally"]})),
        ("reference_not_upstream", "each", None, None, {"reference": "$nodes.tally"}),
    ),
    (
        "misplaced_reference ($item)",
        _edit(_set("publish", input={"text": "$item.text"})),
        ("misplaced_reference", "publish", None, None, {"reference": "$item.text"}),
    ),
    (
        "misplaced_reference ($index in a map's over)",
        _edit(_set("each", over="$index")),
        ("misplaced_reference", "each", None, None, {"reference": "$index"}),
    ),
    (
        "invalid_approval_schema (not a schema)",
        _edit(_set("approve", approval_schema={"type": "thing"})),
        ("invalid_approval_schema", "approve", None, None, {}),
    ),
    (
        "invalid_approval_schema (not an object)",
        _edit(_set("approve", approval_schema=True)),
        ("invalid_approval_schema", "approve", None, None, {}),
    ),
    (
        "invalid_delay (none)",
        _edit(_set("cool_off", seconds=_DROP)),
        ("invalid_delay", "cool_off", None, None, {}),
    ),
    (
        "invalid_delay (both)",
        _edit(_set("cool_off", until="2030-01-01T00:00:00Z")),
        ("invalid_delay", "cool_off", None, None, {}),
    ),
    (
        "invalid_delay (zero)",
        _edit(_set("cool_off", seconds=0)),
        ("invalid_delay", "cool_off", None, None, {}),
    ),
    (
        "invalid_delay (beyond a year)",
        _edit(_set("cool_off", seconds=365 * 24 * 3600 + 1)),
        ("invalid_delay", "cool_off", None, None, {}),
    ),
    (
        "invalid_delay (a string of seconds)",
        _edit(_set("cool_off", seconds="30")),
        ("invalid_delay", "cool_off", None, None, {}),
    ),
    (
        "invalid_delay (a date without an offset)",
        _edit(_set("cool_off", seconds=_DROP, until="2030-01-01T00:00:00")),
        ("invalid_delay", "cool_off", None, None, {}),
    ),
    (
        "invalid_delay (until not text)",
        _edit(_set("cool_off", seconds=_DROP, until=1700000000)),
        ("invalid_delay", "cool_off", None, None, {}),
    ),
    (
        "misplaced_reference (a delay until $item)",
        _edit(_set("cool_off", seconds=_DROP, until="$item.at")),
        ("misplaced_reference", "cool_off", None, None, {"reference": "$item.at"}),
    ),
]


@pytest.mark.parametrize(
    ("document", "expected"),
    [(document, expected) for _, document, expected in DEFECTS if expected is not None],
    ids=[name for name, _, expected in DEFECTS if expected is not None],
)
def test_each_defect_is_reported_with_its_code_and_place(document, expected) -> None:
    expected = expected if isinstance(expected, list) else [expected]
    assert found(document) == expected
    with pytest.raises(InvalidGraph) as caught:
        graph_from_value(document)
    assert [error.code for error in caught.value.errors] == [error[0] for error in expected]


def test_every_code_of_the_design_has_a_defect_above() -> None:
    codes = {"unreachable_node"}
    for _, _, expected in DEFECTS:
        if expected is None:
            continue
        codes |= {error[0] for error in (expected if isinstance(expected, list) else [expected])}
    assert codes == {
        "duplicate_node_id",
        "invalid_node_id",
        "dangling_edge",
        "duplicate_edge",
        "self_edge",
        "cycle",
        "unreachable_node",
        "missing_case_edge",
        "unknown_case",
        "case_on_non_branch",
        "branch_edge_without_case",
        "map_without_body",
        "invalid_map_body",
        "node_name_too_long",
        "blank_node_name",
        "unknown_reference",
        "reference_not_upstream",
        "misplaced_reference",
        "invalid_approval_schema",
        "invalid_delay",
    }


def test_a_node_fed_only_by_a_cycle_is_unreachable() -> None:
    document = next(document for name, document, _ in DEFECTS if name == "unreachable_node")
    assert found(document) == [
        ("cycle", "a", None, None, {"nodes": ["a", "b"]}),
        ("unreachable_node", "c", None, None, {}),
    ]
    # Fed by the cycle and by an entry node too: reachable, so only the cycle is reported.
    document["edges"].append({"from": "d", "to": "c"})
    assert [error[0] for error in found(document)] == ["cycle"]


def test_a_cycle_is_named_in_the_order_its_edges_run() -> None:
    document = chain(6)
    document["edges"].append({"from": "n4", "to": "n1"})
    document["edges"].append({"from": "n5", "to": "n3"})  # a second loop inside the same tangle
    errors = found(document)
    assert errors == [("cycle", "n1", None, None, {"nodes": ["n1", "n2", "n3", "n4"]})]
    document = chain(4)
    document["edges"] += [{"from": "n1", "to": "n0"}, {"from": "n3", "to": "n2"}]
    assert [error[4]["nodes"] for error in found(document)] == [["n0", "n1"], ["n2", "n3"]]


def test_a_document_with_many_defects_reports_every_one_at_once() -> None:
    document = publishing()
    node_of(document, "draft")["name"] = "x" * 100
    node_of(document, "publish")["input"] = {"text": "$nodes.drat", "n": "$index"}
    node_of(document, "each").pop("body")
    node_of(document, "cool_off")["seconds"] = -1
    document["nodes"].append({"id": "research", "kind": "tool", "tool": "echo"})
    document["edges"] += [
        {"from": "draft", "to": "aprove"},
        {"from": "tally", "to": "tally"},
        {"from": "tally", "to": "each"},
        {"from": "route", "to": "publish", "case": "maybe"},
    ]
    document["edges"].pop(4)  # route -> cool_off on "false"
    errors = found(document)
    assert [error[0] for error in errors] == [
        "node_name_too_long",
        "invalid_delay",
        "map_without_body",
        "duplicate_node_id",
        "dangling_edge",
        "self_edge",
        "unknown_case",
        "missing_case_edge",
        "cycle",
        "unknown_reference",
        "misplaced_reference",
    ]
    assert errors[4][3] == "approve"
    assert errors[8][4] == {"nodes": ["each", "tally"]}
    assert errors[9][3] == "draft"
    with pytest.raises(InvalidGraph) as caught:
        parse_graph_json(json.dumps(document))
    assert caught.value.message == "the graph document has 11 validation error(s)"
    assert len(caught.value.details["errors"]) == 11


def _shape_errors() -> list[tuple[Any, str]]:
    tool = {"id": "a", "kind": "tool", "tool": "echo"}

    def doc(*nodes: Any, edges: Any = (), **top: Any) -> dict:
        return {"schema_version": 1, "nodes": list(nodes), "edges": list(edges)} | top

    return [
        ([], "the document must be an object, not a list"),
        ("text", "the document must be an object, not a string"),
        (doc(tool, extra=1), "the document has an unknown field 'extra'"),
        ({"nodes": [tool], "edges": []}, "the document lacks the field 'schema_version'"),
        ({"schema_version": 1, "nodes": [tool]}, "the document lacks the field 'edges'"),
        (doc(tool, schema_version=2), "schema_version must be 1"),
        (doc(tool, schema_version=True), "schema_version must be 1"),
        (doc(tool, schema_version=1.0), "schema_version must be 1"),
        (doc(), "nodes is empty"),
        (doc(*[tool] * 20_001), "nodes holds 20001 nodes; a graph has at most 20000"),
        (doc(tool) | {"nodes": {"a": tool}}, "nodes must be a list, not an object"),
        (doc(tool) | {"edges": None}, "edges must be a list, not null"),
        (doc("a"), "nodes[0] must be an object, not a string"),
        (doc({"kind": "tool", "tool": "echo"}), "nodes[0].id must be a string, not null"),
        (doc({"id": 7, "kind": "tool"}), "nodes[0].id must be a string, not a number"),
        (doc({"id": "a", "kind": "script"}), "nodes[0] ('a').kind must be one of agent, tool"),
        (doc({"id": "a", "kind": ["tool"]}), "nodes[0] ('a').kind must be one of"),
        (doc(tool | {"agent": AGENT}), "nodes[0] ('a') has an unknown field 'agent'"),
        (doc({"id": "a", "kind": "tool"}), "nodes[0] ('a') lacks the field 'tool'"),
        (doc(tool | {"tool": " "}), "nodes[0] ('a').tool must name a tool"),
        (doc(tool | {"name": 5}), "nodes[0] ('a').name must be a string, not a number"),
        (doc({"id": "a", "kind": "agent", "agent": "sha256:AB"}), "must be an agent hash"),
        (doc(tool | {"pinned": True}), "nodes[0] ('a').pinned: only an agent node is pinned"),
        (
            doc({"id": "a", "kind": "agent", "agent": AGENT, "pinned": "yes"}),
            "nodes[0] ('a').pinned must be true or false, not a string",
        ),
        (doc({"id": "a", "kind": "gate", "prompt": ""}), "prompt must say what a person"),
        (doc({"id": "a", "kind": "branch", "on": "$input", "cases": []}), "cases must be a non"),
        (doc({"id": "a", "kind": "branch", "on": "$input", "cases": [1]}), "cases must be a non"),
        (doc({"id": "a", "kind": "branch", "on": "$input", "cases": ["x", "x"]}), "twice"),
        (doc({"id": "a", "kind": "branch", "on": "yes", "cases": ["x"]}), "on must be a ref"),
        (doc({"id": "a", "kind": "branch", "on": "$$x", "cases": ["x"]}), "on must be a ref"),
        (doc({"id": "a", "kind": "map", "over": ["x"]}), "over must be a reference string"),
        (doc({"id": "a", "kind": "map", "over": "$input", "concurrency": 0}), "concurrency"),
        (doc({"id": "a", "kind": "map", "over": "$input", "concurrency": 65}), "concurrency"),
        (doc({"id": "a", "kind": "map", "over": "$input", "concurrency": True}), "concurrency"),
        (doc({"id": "a", "kind": "fold", "over": "$input", "reducer": "avg"}), "reducer must"),
        (doc({"id": "a", "kind": "fold", "over": "$input", "reducer": ["sum"]}), "reducer must"),
        (
            doc({"id": "a", "kind": "fold", "over": "$input", "reducer": "sum", "field": "a."}),
            "field must be a dotted path",
        ),
        (doc(tool, edges=[{"from": "a"}]), "edges[0] lacks the field 'to'"),
        (doc(tool, edges=[{"from": "a", "to": 1}]), "edges[0].to must be a node id string"),
        (doc(tool, edges=[{"from": "a", "to": "a", "when": 1}]), "unknown field 'when'"),
        (doc(tool, edges=[{"from": "a", "to": "a", "case": None}]), "edges[0].case must be a"),
        (doc(tool | {"input": float("nan")}), "holds nan, which is not a JSON number"),
        (doc(tool | {"input": 2**60}), "outside ±9007199254740991"),
        (doc(tool | {"input": {"k": "\x00"}}), "NUL character"),
        (doc(tool | {"input": {1: "a"}}), "not a JSON value"),
        (doc(tool | {"input": {"a"}}), "a set"),
    ]


@pytest.mark.parametrize(("document", "message"), _shape_errors())
def test_a_document_off_the_shape_is_one_malformed_document(document, message) -> None:
    errors = check_graph(document)
    assert [error.code for error in errors] == ["malformed_document"]
    assert message in errors[0].message
    assert errors[0].node is None and errors[0].suggestion is None


def test_malformed_json_text_is_one_malformed_document() -> None:
    for text in ("{", b"\xef\xbb\xbf{}", '{"schema_version": 1, "schema_version": 1}', "[" * 200):
        with pytest.raises(InvalidGraph) as caught:
            parse_graph_json(text)
        assert [error.code for error in caught.value.errors] == ["malformed_document"]


def test_a_misspelt_id_in_a_large_graph_is_suggested_from_the_ids_one_edit_away() -> None:
    document = chain(DIFFLIB_CHOICES + 100)
    document["edges"] += [
        {"from": "n7", "to": "n7x"},  # an insertion
        {"from": "n7", "to": "n-19"},  # a deletion (n19) or a replacement (n119, n219, ...)
        {"from": "n7", "to": "zz"},  # nothing one edit away
    ]
    assert [(error[0], error[3]) for error in found(document)] == [
        ("dangling_edge", "n7"),
        ("dangling_edge", "n19"),  # the earliest in document order
        ("dangling_edge", None),
    ]


def test_suggestions_are_bounded_but_every_error_is_still_reported(monkeypatch) -> None:
    import difflib

    asked = []
    close_matches = difflib.get_close_matches

    def counting(word, choices, *args, **kwargs):
        asked.append(len(choices))
        return close_matches(word, choices, *args, **kwargs)

    monkeypatch.setattr(difflib, "get_close_matches", counting)
    document = chain(20)
    misspelt = [f"n{i}x" for i in range(MAX_SUGGESTIONS + 10)]
    document["edges"] += [{"from": "n0", "to": word} for word in misspelt]
    document["edges"].append({"from": "n0", "to": "n3x"})  # asked before: answered again
    document["edges"].append({"from": "n1", "to": "n" * 200})  # too long to compare
    errors = found(document)
    assert [error[0] for error in errors] == ["dangling_edge"] * (len(misspelt) + 2)
    suggestions = [error[3] for error in errors]
    assert suggestions[:20] == [f"n{i}" for i in range(20)]
    assert suggestions[MAX_SUGGESTIONS:] == [None] * 10 + ["n3", None]
    assert len(asked) == MAX_SUGGESTIONS and max(asked) <= DIFFLIB_CHOICES


def test_pinned_is_read_on_an_agent_node_and_refused_on_a_map_body() -> None:
    pinned = {"id": "a", "kind": "agent", "agent": AGENT, "pinned": True}
    document = {"schema_version": 1, "nodes": [pinned], "edges": []}
    assert check_graph(document) == []
    assert graph_from_value(document).nodes[0].pinned is True
    body = {"kind": "agent", "agent": AGENT, "pinned": True}
    mapped = {"id": "m", "kind": "map", "over": "$input", "body": body}
    [error] = check_graph({"schema_version": 1, "nodes": [mapped], "edges": []})
    assert error.code == "invalid_map_body" and error.node == "m"
    assert "takes no pinned" in error.message
