"""An MCP server built on the official Python SDK, served over streamable HTTP: a reference peer.

``python mcp_sdk_server.py PORT [--json]``: ``add`` returns a sum, ``nap``
returns a result whose ``_meta.salvor`` asks to sleep until its argument.
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

server = MCPServer("sdk-peer", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool()
def nap(until: str) -> CallToolResult:
    """Park the calling salvor run until an instant."""
    return CallToolResult(
        content=[TextContent(type="text", text="napping")], _meta={"salvor": {"sleep_until": until}}
    )


if __name__ == "__main__":
    server.run("streamable-http", port=int(sys.argv[1]), json_response="--json" in sys.argv)
