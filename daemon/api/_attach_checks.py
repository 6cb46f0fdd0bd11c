"""The checks of ``POST /v1/runs/{id}/tools``'s body: names only.

Where the daemon connects, what it spawns and which secret it sends are the operator's
(``--attachable-mcp``), so a body names registry tools and declared MCP servers, and a URL, a
command or a server's table in it is refused before anything is recorded.
"""

from __future__ import annotations

import re
from typing import Any

from ..web import bad_request

# An MCP server's name as a definition's ``[[mcp_servers]]`` gives it.
SERVER_NAME = "^[A-Za-z0-9_-]{1,64}$"
_SERVER_NAME = re.compile(SERVER_NAME)


def tool_names(value: Any) -> list[str]:
    # A name only: where the daemon connects and which secret it sends are the operator's.
    if not isinstance(value, list) or not value:
        raise bad_request("`tools` must be a non-empty array of registry tool names")
    for entry in value:
        if not isinstance(entry, str) or not entry:
            raise bad_request(
                "each `tools` entry is the name of a tool this daemon's registry has; a URL, a "
                "command or a server is never taken from a request"
            )
    return value


def server_names(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise bad_request(
            "`mcp_servers` must be a non-empty array of the operator's attachable server names"
        )
    for entry in value:
        if not isinstance(entry, str) or not _SERVER_NAME.fullmatch(entry):
            raise bad_request(
                "each `mcp_servers` entry is the name of a server the operator declared with "
                "--attachable-mcp; a URL, a command or a server's table is never taken from a "
                "request"
            )
    return value


def tools_or_servers(body: dict) -> None:
    if "tools" not in body and "mcp_servers" not in body:
        raise bad_request("give `tools`, `mcp_servers` or both: what to attach to the run")
