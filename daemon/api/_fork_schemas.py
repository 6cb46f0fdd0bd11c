"""The shapes of a graph run's projection and of its forks: the fork request's body, the answers
of ``GET /v1/runs/{id}/graph``, ``POST /v1/runs/{id}/fork`` and ``GET /v1/runs/{id}/forks``, and
the fork refusals' ``details``.

Each is declared once: the handlers read and answer with these, and the OpenAPI document is built
from them. Plain data, built at import.
"""

from __future__ import annotations

from typing import Any

from salvor.protocol import NodeState

from ..web import bad_request
from ._answers import Answer
from ._body import Body, Field
from ._schema import ANY, JSON, SEQ, closed, ref


def _required(name: str, schema: JSON, description: str = "") -> Field:
    return Field(name=name, schema=schema, required=True, description=description)


def _from_node(value: Any) -> str:
    if not isinstance(value, str):
        raise bad_request("`from_node` must be the id of a node the origin entered, as a string")
    return value


def _acknowledged(value: Any) -> list[int]:
    if not isinstance(value, list):
        value = [None]
    seqs = [_seq(seq) for seq in value]
    if None in seqs:
        raise bad_request(
            "`acknowledge_writes` must be a list of the origin's log positions (non-negative "
            "integers) of the writes that may fire again"
        )
    return seqs


def _seq(value: Any) -> int | None:
    # JSON has one number type: 4.0 is the integer 4 to JSON Schema, and to this check.
    if isinstance(value, float) and value.is_integer() and 0 <= value <= 2**53:
        return int(value)
    return value if type(value) is int and value >= 0 else None


def _dry_run(value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad_request("`dry_run` must be true or false")
    return value


FORK = Body(
    "Fork",
    (
        Field(
            name="from_node",
            required=True,
            schema={"type": "string"},
            check=_from_node,
            description="The node to re-walk from: the fork copies the origin's log below its "
            "entry.",
        ),
        Field(
            name="acknowledge_writes",
            schema={"type": "array", "items": SEQ},
            check=_acknowledged,
            description="The origin seqs of the re-walked segment's writes that may fire again "
            "(default none); each must be one of them, and all of them for the fork to proceed.",
        ),
        Field(
            name="dry_run",
            schema={"type": "boolean"},
            check=_dry_run,
            description="true: plan the fork and answer the plan; nothing is created.",
        ),
    ),
)

_PROJECTED_NODE = closed(
    {
        "node": {"type": "string", "minLength": 1},
        "state": {"enum": [NodeState.ENTERED, NodeState.EXITED, NodeState.SKIPPED]},
        "reason": {"type": "string", "description": "Why the walk passed a skipped node by."},
        "branch_case": {"type": "string", "description": "A branch node: the case it took."},
        "map": {
            **closed(
                {
                    "items": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "How many items the node was entered with.",
                    },
                    "completed": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "How many of them have finished.",
                    },
                },
                ["completed"],
            ),
            "description": "A map node: its fan-out's progress.",
        },
    },
    ["node", "state"],
    **{
        "if": {"properties": {"state": {"const": NodeState.SKIPPED}}},
        "then": {"required": ["reason"]},
        "else": {"not": {"required": ["reason"]}},
    },
)
RECORDED_WRITE = closed(
    {
        "seq": SEQ,
        "tool": {"type": "string"},
        "input": ANY,
        "idempotency_key": {"type": ["string", "null"]},
        "recorded_at": ref("Instant"),
        "run": {
            **ref("RunId"),
            "description": "A map item's write: the item's own run, which recorded it (`seq` is "
            "then the map node's entry in the origin, the seq that acknowledges it).",
        },
        "run_seq": {**SEQ, "description": "A map item's write: its seq in `run`."},
    },
    ["seq", "tool", "input", "idempotency_key", "recorded_at"],
    description="A write intent of the re-walked segment, as the origin (or, for a map item, "
    "the item's run) recorded it.",
    dependentRequired={"run": ["run_seq"], "run_seq": ["run"]},
)

RUN_GRAPH = Answer(
    "RunGraph",
    (
        _required("graph_hash", ref("GraphHash")),
        Field(
            name="current_node",
            schema={"type": "string"},
            description="Present only while a node is entered and not exited.",
        ),
        _required(
            "nodes",
            {"type": "array", "items": _PROJECTED_NODE},
            description="The nodes the walk reached, in walk order; one not reached is absent.",
        ),
        Field(name="forked_from", schema=ref("ForkOrigin"), description="A fork's origin."),
    ),
    description="A graph run's per-node projection.",
)
FORK_CREATED = Answer(
    "ForkCreated",
    (
        _required("run", ref("RunId"), description="The new run."),
        _required("status", {"const": "running"}),
        _required("forked_from", ref("ForkOrigin")),
    ),
)
FORK_PLAN = Answer(
    "ForkPlan",
    (
        _required("dry_run", {"const": True}),
        _required("origin", ref("RunId")),
        _required("from_node", {"type": "string"}),
        _required("through_seq", SEQ, description="The last origin seq the fork would copy."),
        _required("graph_hash", ref("GraphHash")),
        _required("prefix_event_count", {"type": "integer", "minimum": 1}),
        _required(
            "writes",
            {"type": "array", "items": ref("RecordedWrite")},
            description="Every write the re-walked segment recorded.",
        ),
        _required(
            "unacknowledged_writes",
            {"type": "array", "items": SEQ},
            description="The seqs of those not acknowledged.",
        ),
        _required("would_proceed", {"type": "boolean"}),
    ),
    description="A dry run's plan; nothing was created.",
)
FORK_SUMMARY = Answer(
    "ForkSummary",
    (
        _required("run", ref("RunId")),
        _required("from_node", {"type": "string"}),
        _required("through_seq", SEQ),
        _required("acknowledged_writes", {"type": "array", "items": SEQ}),
    ),
)
FORK_LIST = Answer(
    "ForkList",
    (
        _required("run", ref("RunId")),
        _required(
            "derived",
            {"const": True},
            description="Read from the forks' own heads; the origin records nothing of them.",
        ),
        _required(
            "forks", {"type": "array", "items": ref("ForkSummary")}, description="Oldest first."
        ),
    ),
)

FORK_ANSWERS = (RUN_GRAPH, FORK_CREATED, FORK_PLAN, FORK_SUMMARY, FORK_LIST)
FORK_SCHEMAS: JSON = {"RecordedWrite": RECORDED_WRITE, FORK.name: FORK.schema()}
