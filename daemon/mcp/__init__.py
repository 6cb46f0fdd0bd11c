"""The MCP client: server definitions, sessions over stdio and streamable
HTTP, MCP tools as registry tools.

Rule: imports only ``metrics``, ``web``, ``processes`` and ``tools``.
"""

from __future__ import annotations

from ._attachable import (
    ATTACHED_SERVER_PREFIX,
    attached_server,
    attached_specs,
    is_server_attachment,
    server_attachment,
)
from ._client import (
    open_session,
)
from ._definition import (
    MAX_MCP_TIMEOUT,
    SERVER_FIELDS,
    STAND_IN_FIELDS,
    McpDefinitionError,
    McpServerSpec,
    parse_mcp_servers,
)
from ._session import (
    MAX_MESSAGE_BYTES,
    McpError,
    McpNoAnswer,
    McpRemoteError,
    McpSession,
    McpUnavailable,
)
from ._stdio_transport import (
    missing_program,
)
from ._tools import (
    McpBuildError,
    McpConnections,
    asks_to_park,
    check_buildable,
    exposed_tools,
    listing_tool,
    mcp_result_for_model,
    mcp_tool,
    open_connections,
    probe_answer,
    probe_reader,
    salvor_outcome,
)

__all__ = [
    "ATTACHED_SERVER_PREFIX",
    "MAX_MCP_TIMEOUT",
    "MAX_MESSAGE_BYTES",
    "SERVER_FIELDS",
    "STAND_IN_FIELDS",
    "McpBuildError",
    "McpConnections",
    "McpDefinitionError",
    "McpError",
    "McpNoAnswer",
    "McpRemoteError",
    "McpServerSpec",
    "McpSession",
    "McpUnavailable",
    "asks_to_park",
    "attached_server",
    "attached_specs",
    "check_buildable",
    "exposed_tools",
    "is_server_attachment",
    "listing_tool",
    "mcp_result_for_model",
    "mcp_tool",
    "missing_program",
    "open_connections",
    "open_session",
    "parse_mcp_servers",
    "probe_answer",
    "probe_reader",
    "salvor_outcome",
    "server_attachment",
]
