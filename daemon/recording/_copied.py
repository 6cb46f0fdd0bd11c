"""What a call copies of the settled call whose identity it shares (``deduplicated_from``)."""

from __future__ import annotations

import json
from typing import Any

from ..tools import Tool

# What a process agent's MCP lane records of a call beside the server's result: the
# notifications and server requests of its own exchange, which are not the copying call's.
_LANE_FIELDS = frozenset({"result", "notifications", "server_requests"})


def copied_outcome(tool: Tool, recorded: Any) -> Any:
    """The outcome a built-in agent's call of ``tool`` copies from the settled call that
    recorded ``recorded``: that outcome as it is, or, when a process agent's call through a
    lane settled it (``{"result": ...}``), what the tool's own call records and hands the
    model: an MCP tool's server result, or a registry tool's outcome (``relayed_outcome``)."""
    if not isinstance(recorded, dict) or "result" not in recorded:
        return recorded
    if not set(recorded) <= _LANE_FIELDS:
        return recorded
    if tool.mcp_server is not None:
        return recorded["result"]
    result = recorded["result"]
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        return relayed_outcome(result)
    # A registry tool's own outcome that happens to hold only a "result".
    return recorded


def relayed_outcome(result: dict) -> Any:
    """A registry tool's outcome from the MCP result the ``salvor`` server relayed it as: its
    ``structuredContent`` (an object outcome), else the text of its one text block, read as
    the JSON a relayed or probed outcome is written as when it is JSON (so a string outcome
    that reads as JSON comes back as that JSON's value)."""
    if "structuredContent" in result:
        return result["structuredContent"]
    texts = [
        block.get("text")
        for block in result["content"]
        if isinstance(block, dict) and block.get("type") == "text"
    ]
    if len(texts) != 1 or not isinstance(texts[0], str):
        return result
    try:
        return json.loads(texts[0])
    except ValueError:
        return texts[0]
