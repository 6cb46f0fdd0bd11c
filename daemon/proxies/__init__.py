"""The loopback proxies a process agent is pointed at: the model proxy and the MCP stand-in
endpoints and lanes, which record or replay each call through ``recording``, the ``salvor``
server's among them (the flow tools, answered in process).

Rule: imports only the packages below it.
"""

from __future__ import annotations

from ._flow_server import (
    SALVOR_SERVER,
    FlowServer,
    salvor_server,
    self_attached,
)
from ._mcp_lane import (
    McpLane,
    open_lanes,
    variable_suffix,
)
from ._model_listener import ModelProxy, open_model_proxy
from ._model_proxy import ProxySession, recorded_calls
from ._salvor_writes import probes_lane_write
from ._upstream import resolve_upstream
from ._wire import (
    ANTHROPIC_MESSAGES,
    OPENAI_CHAT,
    ROUTES,
    encode_frames,
    error_body,
    final_text,
    final_tool_calls,
)

__all__ = [
    "ANTHROPIC_MESSAGES",
    "OPENAI_CHAT",
    "ROUTES",
    "SALVOR_SERVER",
    "FlowServer",
    "McpLane",
    "ModelProxy",
    "ProxySession",
    "encode_frames",
    "error_body",
    "final_text",
    "final_tool_calls",
    "open_lanes",
    "open_model_proxy",
    "probes_lane_write",
    "recorded_calls",
    "resolve_upstream",
    "salvor_server",
    "self_attached",
    "variable_suffix",
]
