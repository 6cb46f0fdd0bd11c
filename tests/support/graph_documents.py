"""Graph documents the suites above the pure core submit: one valid document holding every node
kind, the same document as YAML, and one with several defects at once.

The agent hashes name no stored agent: storing and validating a graph never looks them up (only
starting a run of it does).
"""

from __future__ import annotations

import copy
from typing import Any

AGENT = "sha256:" + "a" * 64

# Every kind, a name, a branch with cases and a default, a map with a body, references to
# upstream nodes; keys deliberately out of canonical order (the store keeps them as sent).
_EVERY_KIND: dict[str, Any] = {
    "schema_version": 1,
    "nodes": [
        {
            "id": "research",
            "kind": "agent",
            "name": "Research",
            "agent": AGENT,
            "input": {"topic": "$input.topic"},
        },
        {"kind": "gate", "id": "approve", "prompt": "Publish this draft?"},
        {
            "id": "route",
            "kind": "branch",
            "on": "$nodes.approve.approved",
            "cases": ["true", "false"],
            "default": "false",
        },
        {"id": "publish", "kind": "tool", "tool": "publish_post", "input": "$nodes.research"},
        {"id": "cool_off", "kind": "delay", "seconds": 30},
        {
            "id": "each",
            "kind": "map",
            "over": "$input.tickets",
            "concurrency": 4,
            "body": {"kind": "tool", "tool": "lookup_invoice", "input": {"n": "$index"}},
        },
        {"id": "tally", "kind": "fold", "over": "$nodes.each", "reducer": "count"},
        {"id": "later", "kind": "delay", "until": "2030-01-01T00:00:00Z"},
    ],
    "edges": [
        {"from": "research", "to": "approve"},
        {"from": "approve", "to": "route"},
        {"from": "route", "to": "publish", "case": "true"},
        {"from": "route", "to": "cool_off", "case": "false"},
        {"from": "each", "to": "tally"},
    ],
}
SUMMARY = {
    "node_count": 8,
    "edge_count": 5,
    "entry_nodes": ["research", "each", "later"],
    "terminal_nodes": ["publish", "cool_off", "tally", "later"],
}

# The same document as YAML, block style (so it is not JSON text too), keys in another order.
EVERY_KIND_YAML = """\
# The publishing graph, with a map, a fold and two delays beside it.
schema_version: 1
edges:
  - {from: research, to: approve}
  - {from: approve, to: route}
  - {from: route, to: publish, case: "true"}
  - {from: route, to: cool_off, case: "false"}
  - {from: each, to: tally}
nodes:
  - id: research
    kind: agent
    name: Research
    agent: sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    input:
      topic: $input.topic
  - {kind: gate, id: approve, prompt: "Publish this draft?"}
  - id: route
    kind: branch
    "on": $nodes.approve.approved
    cases: ["true", "false"]
    default: "false"
  - {id: publish, kind: tool, tool: publish_post, input: $nodes.research}
  - {id: cool_off, kind: delay, seconds: 30}
  - id: each
    kind: map
    over: $input.tickets
    concurrency: 4
    body:
      kind: tool
      tool: lookup_invoice
      input: {n: $index}
  - {id: tally, kind: fold, over: $nodes.each, reducer: count}
  - {id: later, kind: delay, until: "2030-01-01T00:00:00Z"}
"""


def every_kind() -> dict[str, Any]:
    """A fresh copy of the valid document (a test may change it)."""
    return copy.deepcopy(_EVERY_KIND)


def three_defects() -> tuple[dict[str, Any], set[str]]:
    """A document with a dangling (misspelt) edge, a duplicate id and a blank name, and their
    codes."""
    document = every_kind()
    document["edges"].append({"from": "tally", "to": "publsh"})
    document["nodes"].append({"id": "tally", "kind": "delay", "seconds": 1})
    document["nodes"][0]["name"] = "   "
    return document, {"dangling_edge", "duplicate_node_id", "blank_node_name"}
