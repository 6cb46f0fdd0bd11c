"""Graph documents the graph tests share: one valid document of every node kind, and builders.

``publishing()`` is the README's research -> draft -> approve -> publish graph
with a map and a fold beside it; a test copies it and breaks one thing.
"""

from __future__ import annotations

import copy
from typing import Any

AGENT = "sha256:" + "a" * 64
OTHER_AGENT = "sha256:" + "b" * 64

_PUBLISHING: dict[str, Any] = {
    "schema_version": 1,
    "nodes": [
        {
            "id": "research",
            "kind": "agent",
            "name": "Research",
            "agent": AGENT,
            "input": {"topic": "$input.topic"},
        },
        {"id": "draft", "kind": "agent", "agent": OTHER_AGENT},
        {
            "id": "approve",
            "kind": "gate",
            "prompt": "Publish this draft?",
            "approval_schema": {
                "type": "object",
                "required": ["approved"],
                "properties": {"approved": {"type": "boolean"}},
            },
        },
        {
            "id": "route",
            "kind": "branch",
            "on": "$nodes.approve.approved",
            "cases": ["true", "false"],
            "default": "false",
        },
        {
            "id": "publish",
            "kind": "tool",
            "tool": "publish_post",
            "input": {"text": "$nodes.draft"},
        },
        {"id": "cool_off", "kind": "delay", "seconds": 30},
        {
            "id": "each",
            "kind": "map",
            "over": "$input.tickets",
            "concurrency": 4,
            "body": {"kind": "agent", "agent": AGENT, "input": {"ticket": "$item", "n": "$index"}},
        },
        {
            "id": "tally",
            "kind": "fold",
            "over": "$nodes.each",
            "reducer": "sum",
            "field": "minutes",
        },
    ],
    "edges": [
        {"from": "research", "to": "draft"},
        {"from": "draft", "to": "approve"},
        {"from": "approve", "to": "route"},
        {"from": "route", "to": "publish", "case": "true"},
        {"from": "route", "to": "cool_off", "case": "false"},
        {"from": "each", "to": "tally"},
    ],
}


def publishing() -> dict[str, Any]:
    """A fresh copy of the valid document above."""
    return copy.deepcopy(_PUBLISHING)


def node_of(document: dict, node_id: str) -> dict:
    """The node ``node_id`` of ``document`` (the first with that id)."""
    return next(node for node in document["nodes"] if node.get("id") == node_id)


def chain(count: int) -> dict[str, Any]:
    """``count`` tool nodes n0 -> n1 -> ... in a line."""
    return {
        "schema_version": 1,
        "nodes": [{"id": f"n{i}", "kind": "tool", "tool": "echo"} for i in range(count)],
        "edges": [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(count - 1)],
    }
