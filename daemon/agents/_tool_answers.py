"""What the built-in agent loop hands the model back for a tool call: a tool result block (text,
or an MCP result as the model reads it), an error result, and what a subagent call's recorded
answer carries (its tokens counted toward the parent, the tools its child attached)."""

from __future__ import annotations

import json
from typing import Any

from salvor.protocol import (
    TOOL_ERROR_KEY,
)

from ..mcp import (
    mcp_result_for_model,
)


def as_text(value: Any) -> str:
    return (
        value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    )


def tool_result(use_id: str, value: Any, *, mcp: bool = False) -> dict:
    if isinstance(value, dict) and TOOL_ERROR_KEY in value:
        return {
            "type": "tool_result",
            "tool_use_id": use_id,
            "content": value[TOOL_ERROR_KEY]["message"],
            "is_error": True,
        }
    if mcp:
        text, is_error = mcp_result_for_model(value)
        return {
            "type": "tool_result",
            "tool_use_id": use_id,
            "content": text,
            **({"is_error": True} if is_error else {}),
        }
    return {"type": "tool_result", "tool_use_id": use_id, "content": as_text(value)}


def text_of(content: list) -> str:
    return "".join(block.get("text", "") for block in content if block.get("type") == "text")


def counted_child(value: Any, usage: dict) -> tuple[Any, int]:
    """A subagent call's output less the child's usage it carries, which is added to ``usage``;
    and the child's model calls. The child's calls count toward this conversation's budgets as
    the call's output recorded them, so a replay counts the same."""
    child = value.get("usage") if isinstance(value, dict) else None
    keys = ("input_tokens", "output_tokens", "steps")
    if not (isinstance(child, dict) and all(type(child.get(key)) is int for key in keys)):
        return value, 0
    usage["input_tokens"] += child["input_tokens"]
    usage["output_tokens"] += child["output_tokens"]
    return {k: v for k, v in value.items() if k != "usage"}, child["steps"]


def attached_by(value: Any) -> list[str]:
    """The names an ``attach_tool`` call's recorded answer attached (none for an error)."""
    names = value.get("attached") if isinstance(value, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def error_result(use_id: str, message: str) -> dict:
    return {"type": "tool_result", "tool_use_id": use_id, "content": message, "is_error": True}
