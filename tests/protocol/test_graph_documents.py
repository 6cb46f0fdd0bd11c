"""Graph documents that are valid: what a Graph holds, its order, defaults and hash."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from salvor.protocol import (
    GraphEdge,
    InvalidGraph,
    NodeKind,
    canonical_json,
    graph_from_value,
    parse_graph_json,
    parse_graph_yaml,
    sha256_hash,
)

from tests.protocol.graphs import AGENT, chain, node_of, publishing


def test_a_valid_document_becomes_a_graph_of_its_nodes_and_edges() -> None:
    document = publishing()
    graph = graph_from_value(document)
    assert graph.document == publishing()
    assert [node.id for node in graph.nodes] == [node["id"] for node in document["nodes"]]
    assert graph.node("research").kind is NodeKind.AGENT
    assert graph.node("research").name == "Research"
    assert graph.node("route").cases == ("true", "false")
    assert graph.node("each").body.kind is NodeKind.AGENT
    assert graph.node("each").body.agent == AGENT
    assert graph.edges[3] == GraphEdge("route", "publish", "true")
    with pytest.raises(KeyError):
        graph.node("nope")


def test_order_entry_and_terminal_nodes_follow_the_edges_then_document_order() -> None:
    graph = graph_from_value(publishing())
    assert graph.order == (
        "research",
        "draft",
        "approve",
        "route",
        "publish",
        "cool_off",
        "each",
        "tally",
    )
    assert graph.entry_nodes == ("research", "each")
    assert graph.terminal_nodes == ("publish", "cool_off", "tally")
    assert graph.summary() == {
        "node_count": 8,
        "edge_count": 6,
        "entry_nodes": ["research", "each"],
        "terminal_nodes": ["publish", "cool_off", "tally"],
    }
    assert graph.predecessors("route") == (GraphEdge("approve", "route"),)
    assert graph.successors("route") == (
        GraphEdge("route", "publish", "true"),
        GraphEdge("route", "cool_off", "false"),
    )
    assert graph.predecessors("research") == ()


def test_a_later_node_in_the_document_can_come_first_in_the_order() -> None:
    document = chain(3)
    document["edges"] = [{"from": "n2", "to": "n0"}, {"from": "n0", "to": "n1"}]
    assert graph_from_value(document).order == ("n2", "n0", "n1")


def test_an_omitted_input_defaults_from_the_predecessors() -> None:
    document = chain(4)
    document["edges"].append({"from": "n0", "to": "n2"})
    graph = graph_from_value(document)
    assert graph.node("n0").input == "$input"
    assert graph.node("n1").input == "$nodes.n0"
    assert graph.node("n2").input == {"n1": "$nodes.n1", "n0": "$nodes.n0"}
    # Two edges out of one branch into one node: one predecessor.
    routed = publishing()
    routed["edges"][4]["to"] = "publish"
    del node_of(routed, "publish")["input"]
    routed["nodes"].remove(node_of(routed, "cool_off"))
    assert graph_from_value(routed).node("publish").input == "$nodes.route"
    body = graph_from_value(_map_without_input()).node("each").body
    assert body.input == "$item"


def _map_without_input() -> dict:
    document = publishing()
    del node_of(document, "each")["body"]["input"]
    return document


def test_defaults_are_filled_in_the_nodes_but_never_in_the_stored_document() -> None:
    document = publishing()
    del node_of(document, "approve")["approval_schema"]
    del node_of(document, "each")["concurrency"]
    graph = graph_from_value(document)
    assert graph.node("approve").approval_schema == {"type": "object"}
    assert graph.node("each").concurrency == 8
    assert graph.node("draft").input == "$nodes.research"
    assert "approval_schema" not in node_of(graph.document, "approve")
    assert "input" not in node_of(graph.document, "draft")
    assert graph.hash == sha256_hash(document)


def test_the_hash_is_rfc_8785_over_the_document_as_submitted() -> None:
    document = publishing()
    graph = parse_graph_json(json.dumps(document))
    assert graph.hash == sha256_hash(document)
    assert graph.hash.startswith("sha256:") and len(graph.hash) == 7 + 64
    # Key order and whitespace are not part of the document.
    shuffled = json.dumps(
        {"edges": document["edges"], "nodes": document["nodes"], "schema_version": 1}, indent=3
    )
    assert parse_graph_json(shuffled.encode()).hash == graph.hash
    assert json.loads(canonical_json(graph.document)) == document


def test_a_renamed_node_is_a_different_graph() -> None:
    document = publishing()
    node_of(document, "research")["name"] = "Look it up"
    assert graph_from_value(document).hash != graph_from_value(publishing()).hash


def test_json_and_yaml_of_one_document_hash_alike() -> None:
    yaml_text = """
schema_version: 1
nodes:
  - id: research
    kind: agent
    name: Research
    agent: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    input: {topic: $input.topic}
  - id: draft
    kind: agent
    agent: "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
  - id: approve
    kind: gate
    prompt: Publish this draft?
    approval_schema:
      type: object
      required: [approved]
      properties:
        approved: {type: boolean}
  - id: route
    kind: branch
    on: $nodes.approve.approved
    cases: ["true", "false"]
    default: "false"
  - {id: publish, kind: tool, tool: publish_post, input: {text: $nodes.draft}}
  - {id: cool_off, kind: delay, seconds: 30}
  - id: each
    kind: map
    over: $input.tickets
    concurrency: 4
    body:
      kind: agent
      agent: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
      input: {ticket: $item, n: $index}
  - {id: tally, kind: fold, over: $nodes.each, reducer: sum, field: minutes}
edges:
  - {from: research, to: draft}
  - {from: draft, to: approve}
  - {from: approve, to: route}
  - {from: route, to: publish, case: "true"}
  - {from: route, to: cool_off, case: "false"}
  - {from: each, to: tally}
"""
    from_yaml = parse_graph_yaml(yaml_text)
    assert from_yaml.document == publishing()
    assert from_yaml.hash == parse_graph_json(json.dumps(publishing())).hash
    assert parse_graph_yaml(yaml_text.encode()).hash == from_yaml.hash


def test_an_invalid_document_raises_invalid_graph_with_the_envelope_the_api_sends() -> None:
    document = chain(2)
    document["edges"].append({"from": "n1", "to": "nn0"})
    with pytest.raises(InvalidGraph) as caught:
        graph_from_value(document)
    error = caught.value
    assert error.status == 400
    assert error.to_json() == {
        "error": {
            "code": "invalid_graph",
            "message": "the graph document has 1 validation error(s)",
            "details": {
                "errors": [
                    {
                        "code": "dangling_edge",
                        "message": "edges[1] (n1 -> nn0): there is no node 'nn0'",
                        "edge": {"from": "n1", "to": "nn0"},
                        "suggestion": "n0",
                        "missing": "nn0",
                    }
                ]
            },
        }
    }
    assert [e.code for e in error.errors] == ["dangling_edge"]


def test_the_readme_graph_is_valid_and_its_defaults_are_as_the_readme_says() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Graphs") :]
    example = re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)
    graph = parse_graph_yaml(example.replace("<64 hex>", "a" * 64))
    assert graph.order == ("research", "draft", "approve", "route", "publish", "shelve")
    assert graph.node("draft").input == "$nodes.research"
    assert graph.node("approve").approval_schema == {"type": "object"}


def test_the_graph_api_of_the_design_is_exported_from_salvor_protocol() -> None:
    import salvor.protocol

    names = [
        "GRAPH_SCHEMA_VERSION",
        "NodeKind",
        "GraphNode",
        "GraphEdge",
        "Graph",
        "GraphError",
        "InvalidGraph",
        "graph_from_value",
        "parse_graph_json",
        "parse_graph_yaml",
        "check_graph",
        "TemplateError",
        "resolve_template",
        "references",
        "Reference",
        "fold_values",
        "pick_case",
        "MISSING",
    ]
    missing = [name for name in names if not hasattr(salvor.protocol, name)]
    assert missing == []
    assert salvor.protocol.GRAPH_SCHEMA_VERSION == 1
    assert [str(kind) for kind in NodeKind] == [
        "agent",
        "tool",
        "gate",
        "branch",
        "map",
        "fold",
        "delay",
        "flow",
        "snapshot",
    ]
    assert InvalidGraph([]).code == "invalid_graph"
