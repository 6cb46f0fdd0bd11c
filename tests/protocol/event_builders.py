"""Events, envelopes and short logs for the protocol tests, each in its common shape.

A builder takes keywords to override the shape it gives; ``wrap`` turns events into a log with
contiguous seq from 0 (``recorded_at`` one second apart), and ``S``, ``GS`` and ``MODEL_STEP`` are
the openings most cases start from.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from salvor.protocol import (
    SCHEMA_VERSION,
    BudgetExceeded,
    Envelope,
    Event,
    GraphRunStarted,
    ModelCallCompleted,
    ModelCallRequested,
    RunStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    format_instant,
)

RUN = "run-1"


OTHER_RUN = "run-2"


AGENT = "sha256:" + "a" * 64


REQUEST = "sha256:" + "b" * 64


REQUEST_2 = "sha256:" + "c" * 64


GRAPH = "sha256:" + "d" * 64


WAKE_AT = "2026-08-14T09:00:00Z"


EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


APPROVAL_SCHEMA = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}},
}


# `required` with no `type`: read as asking for an object.
UNTYPED_SCHEMA = {"required": ["approved"]}


def recorded_at(seq: int) -> str:
    return format_instant(EPOCH + timedelta(seconds=seq))


def envelope(
    seq: int,
    event: Event,
    *,
    run_id: str = RUN,
    schema_version: int = SCHEMA_VERSION,
) -> Envelope:
    return Envelope(
        run_id=run_id,
        seq=seq,
        schema_version=schema_version,
        recorded_at=recorded_at(seq),
        event=event,
    )


def wrap(events: list[Event], *, run_id: str = RUN) -> list[Envelope]:
    """Envelopes for ``events`` with contiguous seq from 0."""
    return [envelope(seq, event, run_id=run_id) for seq, event in enumerate(events)]


# Event shorthands: the common shape, overridable by keyword.


def started(**fields: Any) -> RunStarted:
    return RunStarted(**{"agent_def_hash": AGENT, "input": {"claim": "C-7"}} | fields)


def graph_started(**fields: Any) -> GraphRunStarted:
    return GraphRunStarted(**{"graph_hash": GRAPH, "input": {"topic": "tides"}, **fields})


def model(**fields: Any) -> ModelCallRequested:
    return ModelCallRequested(**{"request_hash": REQUEST} | fields)


def model_done(seq: int, input_tokens: int = 10, output_tokens: int = 5) -> ModelCallCompleted:
    return ModelCallCompleted(
        seq=seq,
        response={"content": [{"type": "text", "text": "ok"}]},
        usage={"input_tokens": input_tokens, "output_tokens": output_tokens},
    )


def tool(name: str = "lookup", effect: str = "read", **fields: Any) -> ToolCallRequested:
    base = {"tool": name, "input": {"invoice": "A-1"}, "effect": effect, "idempotency_key": None}
    return ToolCallRequested(**base | fields)


def write(name: str = "charge", **fields: Any) -> ToolCallRequested:
    return tool(name, "write", **{"input": {"amount": 10}} | fields)


def tool_done(seq: int, output: Any = None, **fields: Any) -> ToolCallCompleted:
    return ToolCallCompleted(
        seq=seq, output={"found": True} if output is None else output, **fields
    )


def gate(schema: dict | None = None, **fields: Any) -> Suspended:
    return Suspended(
        reason="approve the refund",
        input_schema=APPROVAL_SCHEMA if schema is None else schema,
        **fields,
    )


def over_budget(kind: str = "tokens", limit: float = 400, observed: float = 400) -> BudgetExceeded:
    return BudgetExceeded(budget={"kind": kind, "limit": limit}, observed=observed)


def pending_model(seq: int, request_hash: str = REQUEST) -> dict:
    return {"kind": "model", "seq": seq, "request_hash": request_hash}


def pending_tool(
    seq: int,
    name: str = "lookup",
    effect: str = "read",
    tool_input: Any = None,
    idempotency_key: str | None = None,
) -> dict:
    return {
        "kind": "tool",
        "seq": seq,
        "tool": name,
        "input": {"invoice": "A-1"} if tool_input is None else tool_input,
        "effect": effect,
        "idempotency_key": idempotency_key,
    }


# The openings most cases start from.
S = started()
GS = graph_started()
MODEL_STEP = [S, model(), model_done(1)]  # seq 0..2: one completed model call, usage 10/5
SIGNAL_SCHEMA = {"type": "object", "required": ["payment_id"]}
