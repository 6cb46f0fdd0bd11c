"""MCP servers attached to a run tree at run time, by the name the operator declared them under.

An attachment is recorded as a name, never as a declaration: ``ToolsAttached`` and the
``salvor.tools`` label a child inherits hold ``mcp:<server>`` beside registry tool names (the
prefix a server's listing call carries in the log too, and no registry tool name holds ``:``).
What the name reaches is read from the operator's declarations (``salvor serve
--attachable-mcp``) each time a drive connects, so no URL, command or header of it is ever in a
log, and a server the operator withdrew is refused by name, not dialled from an old record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ._definition import McpServerSpec

ATTACHED_SERVER_PREFIX = "mcp:"


def server_attachment(server: str) -> str:
    """The attachment name of the declared MCP server ``server``."""
    return f"{ATTACHED_SERVER_PREFIX}{server}"


def attached_server(name: str) -> str | None:
    """The MCP server an attachment name stands for (None: a registry tool's name)."""
    return name.removeprefix(ATTACHED_SERVER_PREFIX) if is_server_attachment(name) else None


def is_server_attachment(name: str) -> bool:
    return name.startswith(ATTACHED_SERVER_PREFIX)


def attached_specs(
    names: Iterable[str], declared: Mapping[str, McpServerSpec]
) -> tuple[list[McpServerSpec], list[str]]:
    """The declarations of the servers among the attachment ``names``, in order, and the
    servers named that ``declared`` (the operator's file today) no longer has."""
    found, withdrawn = [], []
    for name in names:
        server = attached_server(name)
        if server is None:
            continue
        spec = declared.get(server)
        if spec is None:
            withdrawn.append(server)
        else:
            found.append(spec)
    return found, withdrawn
