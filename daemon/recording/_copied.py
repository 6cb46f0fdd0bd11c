"""What a call copies of the settled call whose identity it shares (``deduplicated_from``)."""

from __future__ import annotations

from typing import Any

from ..tools import Tool

# What a process agent's MCP lane records of a call beside the server's result: the
# notifications and server requests of its own exchange, which are not the copying call's.
_LANE_FIELDS = frozenset({"result", "notifications", "server_requests"})


def copied_outcome(tool: Tool, recorded: Any) -> Any:
    """The outcome a built-in agent's call of ``tool`` copies from the settled call that
    recorded ``recorded``: that outcome as it is, or, for an MCP tool whose identity a process
    agent's call through a lane settled (``{"result": ...}``), the server's result in it, the
    shape the tool's own call records and hands the model."""
    if tool.mcp_server is None or not isinstance(recorded, dict):
        return recorded
    if "result" in recorded and set(recorded) <= _LANE_FIELDS:
        return recorded["result"]
    return recorded
