"""Agents with flow tools for the suites, and the scripted replies their conversations need.

``with_flows`` gives a parsed definition other flow fields (``flow_tools``, ``outputs``), for
tests that drive a definition in-process (its hash stays the one parsed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy
from salvor.daemon.agents import AgentDefinition
from salvor.protocol import FlowTool, parse_outputs
from salvor.store import normalize_store_url


def with_flows(
    agent: AgentDefinition, *, flow_tools: Sequence[str] = (), outputs: Any = ()
) -> AgentDefinition:
    """``agent`` opting into ``flow_tools`` and declaring ``outputs`` (``parse_outputs``'s)."""
    chosen = tuple(FlowTool(name) for name in flow_tools)
    return dataclasses.replace(agent, flow_tools=chosen, outputs=parse_outputs(list(outputs)))


def tool_use(name: str, tool_input: Any, *, use_id: str = "toolu_0", tokens: int = 10):
    """A scripted reply calling ``name`` (``ScriptedProvider``'s neutral shape)."""
    return tool_uses([(name, tool_input)], use_id=use_id, tokens=tokens)


def tool_uses(uses: Sequence[tuple[str, Any]], *, use_id: str = "toolu_0", tokens: int = 10):
    """A scripted reply calling each of ``uses`` in order, in one response."""
    content = [
        {"type": "tool_use", "id": f"{use_id}_{index}", "name": name, "input": tool_input}
        for index, (name, tool_input) in enumerate(uses)
    ]
    return (
        {"model": "scripted-model", "content": content, "stop_reason": "tool_use"},
        {"input_tokens": tokens, "output_tokens": 5},
    )


def offered_tools(call) -> list[str]:
    """The tool names a provider call offered the model."""
    return [tool["name"] for tool in call.request.get("tools") or []]


def tool_results(call) -> list[dict]:
    """The tool results the conversation of ``call`` holds, oldest first."""
    return [
        block
        for message in call.request["messages"]
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


def triage_graph(agent: str) -> dict:
    """An agent-decision graph: ``triage`` (the agent) finishes with a ``branch`` the ``route``
    node routes on, ``urgent`` to ``page`` (a send_email of its typed ``priority`` and summary),
    ``later`` to ``shelve`` (a delay)."""
    return {
        "schema_version": 1,
        "nodes": [
            {"id": "triage", "kind": "agent", "agent": agent, "input": "$input"},
            {
                "id": "route",
                "kind": "branch",
                "on": "$nodes.triage.branch",
                "cases": ["urgent", "later"],
            },
            {
                "id": "page",
                "kind": "tool",
                "tool": "send_email",
                "input": {
                    "to": "oncall@example.com",
                    "subject": "$nodes.triage.outputs.priority",
                    "body": "$nodes.triage.summary",
                },
            },
            {"id": "shelve", "kind": "delay", "seconds": 60},
        ],
        "edges": [
            {"from": "triage", "to": "route"},
            {"from": "route", "to": "page", "case": "urgent"},
            {"from": "route", "to": "shelve", "case": "later"},
        ],
    }


# Every table of the store: what a read-only operation must leave exactly as it was.
STORE_TABLES = (
    "events",
    "runs",
    "agents",
    "graphs",
    "claims",
    "probe_answers",
    "notifications",
    "nodes",
    "store_meta",
)


# What a live daemon's heartbeat changes in the store on its own, about once a second: its node
# row's lease. A read-only check compares everything else.
_HEARTBEAT = {"nodes": "lease_expires_at"}


def store_tables(store_url: str) -> dict[str, list]:
    """Every row of every table of the store at ``store_url``, sorted, but the lease a node's
    heartbeat renews (blocking: call it in a thread from trio)."""
    engine = sqlalchemy.create_engine(normalize_store_url(store_url))
    try:
        with engine.connect() as connection:
            tables = {}
            for table in STORE_TABLES:
                rows = connection.execute(sqlalchemy.text(f"SELECT * FROM {table}")).mappings()
                renewed = _HEARTBEAT.get(table)
                tables[table] = sorted(
                    tuple(value for key, value in row.items() if key != renewed) for row in rows
                )
            return tables
    finally:
        engine.dispose()
