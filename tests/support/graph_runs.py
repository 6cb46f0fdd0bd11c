"""Graph-run logs written by hand, for the tests of the projection, of forks and of their routes.

``published()`` is a whole legal walk of ``tests.protocol.graphs.publishing()`` (research ->
draft -> approve -> route -> publish, cool_off skipped, the map ``each`` over two tickets, the
fold ``tally``), recorded as the walker records one, so these tests do not need the walker. Its
seqs are fixed (the module constants below name the ones the tests talk about); ``legal`` checks a
log through the append guard, so a builder here cannot drift into a log the store would refuse.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from salvor.protocol import (
    EMPTY_VIEW,
    SCHEMA_VERSION,
    Envelope,
    Event,
    GraphRunStarted,
    MapItemCompleted,
    ModelCallCompleted,
    ModelCallRequested,
    NodeEntered,
    NodeExited,
    NodeSkipped,
    Resumed,
    RunCompleted,
    RunStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    check_next,
    format_instant,
    step,
)

GRAPH = "sha256:" + "d" * 64
AGENT = "sha256:" + "a" * 64
REQUEST = "sha256:" + "b" * 64
RUN_INPUT = {"topic": "tides", "tickets": [{"minutes": 3}, {"minutes": 4}]}
APPROVAL = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}},
}


def approval_graph(agent: str, *, draft_input: Any = None) -> dict:
    """draft (``agent``) -> approve (a gate) -> route: "true" sends an email, "false" shelves the
    draft for a minute. ``draft_input``: the draft node's input (default ``{"topic":
    "$input.topic"}``)."""
    return {
        "schema_version": 1,
        "nodes": [
            {
                "id": "draft",
                "kind": "agent",
                "agent": agent,
                "input": {"topic": "$input.topic"} if draft_input is None else draft_input,
            },
            {"id": "approve", "kind": "gate", "prompt": "Send it?", "approval_schema": APPROVAL},
            {
                "id": "route",
                "kind": "branch",
                "on": "$nodes.approve.approved",
                "cases": ["true", "false"],
            },
            {
                "id": "send",
                "kind": "tool",
                "tool": "send_email",
                "input": {"to": "$input.to", "subject": "Draft", "body": "$nodes.draft"},
            },
            {"id": "shelve", "kind": "delay", "seconds": 60},
        ],
        "edges": [
            {"from": "draft", "to": "approve"},
            {"from": "approve", "to": "route"},
            {"from": "route", "to": "send", "case": "true"},
            {"from": "route", "to": "shelve", "case": "false"},
        ],
    }


SKIP_REASON = "no live inbound edge: an upstream branch routed to another case"
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

# Where ``published()`` records what the fork tests talk about.
READ_SEQ = 4  # research's lookup: a read
DRAFT_WRITE = 8  # draft's save_draft: a write
IDEMPOTENT_SEQ = 10  # draft's tag_draft: idempotent, keyed
PUBLISH_WRITE = 20  # publish's publish_post: a write
ENTERED_AT = {
    "research": 1,
    "draft": 7,
    "approve": 13,
    "route": 17,
    "publish": 19,
    "each": 24,
    "tally": 28,
}


def _tool(name: str, effect: str, tool_input: Any, key: str | None = None) -> ToolCallRequested:
    return ToolCallRequested(tool=name, input=tool_input, effect=effect, idempotency_key=key)


def published(graph_hash: str = GRAPH, **head: Any) -> list[Event]:
    """The events of a whole walk of the publishing graph (seqs as the constants above say)."""
    tickets = RUN_INPUT["tickets"]
    return [
        GraphRunStarted(graph_hash=graph_hash, input=RUN_INPUT, **head),  # 0
        NodeEntered(node="research", input={"topic": "tides"}),  # 1
        ModelCallRequested(request_hash=REQUEST),  # 2
        ModelCallCompleted(seq=2, response={"content": []}, usage=_usage()),  # 3
        _tool("lookup", "read", {"q": "tides"}),  # 4
        ToolCallCompleted(seq=4, output={"found": 2}),  # 5
        NodeExited(node="research", output="notes"),  # 6
        NodeEntered(node="draft", input="notes"),  # 7
        _tool("save_draft", "write", {"text": "draft one"}),  # 8
        ToolCallCompleted(seq=8, output={"saved": True}),  # 9
        _tool("tag_draft", "idempotent", {"tag": "tides"}, key="draft-tag"),  # 10
        ToolCallCompleted(seq=10, output={"tagged": True}),  # 11
        NodeExited(node="draft", output="draft one"),  # 12
        NodeEntered(node="approve", input=None),  # 13
        Suspended(reason="prompt", input_schema=APPROVAL),  # 14
        Resumed(input={"approved": True}),  # 15
        NodeExited(node="approve", output={"approved": True}),  # 16
        NodeEntered(node="route", input=True),  # 17
        NodeExited(node="route", output=True, branch_case="true"),  # 18
        NodeEntered(node="publish", input={"text": "draft one"}),  # 19
        _tool("publish_post", "write", {"text": "draft one"}),  # 20
        ToolCallCompleted(seq=20, output={"posted": True}),  # 21
        NodeExited(node="publish", output={"posted": True}),  # 22
        NodeSkipped(node="cool_off", reason=SKIP_REASON),  # 23
        NodeEntered(node="each", input=tickets),  # 24
        MapItemCompleted(node="each", index=1, run_id="child-1", output={"minutes": 4}),  # 25
        MapItemCompleted(node="each", index=0, run_id="child-0", output={"minutes": 3}),  # 26
        NodeExited(node="each", output=[{"minutes": 3}, {"minutes": 4}]),  # 27
        NodeEntered(node="tally", input=[{"minutes": 3}, {"minutes": 4}]),  # 28
        NodeExited(node="tally", output=7),  # 29
        RunCompleted(output={"publish": {"posted": True}, "tally": 7}),  # 30
    ]


def agent_run() -> list[Event]:
    """An ordinary agent run: started, one model call."""
    return [
        RunStarted(agent_def_hash=AGENT, input=None),
        ModelCallRequested(request_hash=REQUEST),
        ModelCallCompleted(seq=1, response={"content": []}, usage=_usage()),
    ]


def _usage() -> dict:
    return {"input_tokens": 10, "output_tokens": 5}


def wrap(events: list[Event], run_id: str = "origin") -> list[Envelope]:
    """Envelopes for ``events`` at seq 0.., one second apart from a fixed instant."""
    return [
        Envelope(
            run_id=run_id,
            seq=seq,
            schema_version=SCHEMA_VERSION,
            recorded_at=format_instant(EPOCH + timedelta(seconds=seq)),
            event=event,
        )
        for seq, event in enumerate(events)
    ]


def legal(events: list[Event], run_id: str = "origin") -> list[Envelope]:
    """``wrap(events)``, each envelope accepted by the append guard after the ones before it."""
    log, view = wrap(events, run_id), EMPTY_VIEW
    for envelope in log:
        check_next(view, envelope)
        view = step(view, envelope)
    return log
