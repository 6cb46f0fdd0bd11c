"""The MCP servers the operator lets be attached to a run tree at run time (``salvor serve
--attachable-mcp FILE``): a TOML file whose ``[[mcp_servers]]`` tables are written exactly as an
agent definition's are, each held at start to the same declarations an HTTP caller's definition
is (a ``url`` on a declared ``--mcp-origin``, a ``command`` only with
``--allow-process-agents``).

An HTTP caller or an agent then attaches one by its name only: where the daemon connects, what it
spawns and which secret it sends are the operator's, read from this file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from ..mcp import McpDefinitionError, McpServerSpec, parse_mcp_servers
from ._credentials import Credentials, Undeclared
from ._definition_reach import OPT_IN_REASONS

# The most an attachable-servers file may hold: an operator's list, not a data set.
MAX_ATTACHABLE_BYTES = 1 << 20


class AttachableError(ValueError):
    """The attachable-servers file cannot be used; one sentence naming the file and why."""


def load_attachable_servers(
    path: str, credentials: Credentials | None, allow_processes: bool
) -> Mapping[str, McpServerSpec]:
    """The servers ``path`` declares, by name, each checked as an HTTP caller's would be
    (``credentials`` None: the command line's own use, which trusts its files as it does an
    agent file).

    Raises:
        AttachableError: the file is unreadable, not TOML, holds a key other than
            ``mcp_servers``, or a server does not validate or reaches what the operator did not
            declare; nothing is kept.
    """
    where = f"--attachable-mcp {path}"
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AttachableError(f"{where} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_ATTACHABLE_BYTES:
        raise AttachableError(f"{where} is larger than {MAX_ATTACHABLE_BYTES} bytes")
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AttachableError(f"{where} is not a TOML file: {exc}") from None
    unknown = sorted(set(raw) - {"mcp_servers"})
    if unknown:
        raise AttachableError(
            f"{where} has the key `{unknown[0]}`; it declares [[mcp_servers]] tables only"
        )
    try:
        servers = parse_mcp_servers(raw.get("mcp_servers", []))
        for server in servers:
            if server.url is not None and credentials is not None:
                credentials.check_mcp_url(
                    server.name, server.url, server.headers, server.bearer_token_env
                )
    except (McpDefinitionError, Undeclared) as exc:
        raise AttachableError(f"{where}: {exc}") from None
    spawning = next((server for server in servers if server.command is not None), None)
    if spawning is not None and not allow_processes:
        raise AttachableError(
            f"{where}: [[mcp_servers]] {spawning.name!r}: {OPT_IN_REASONS['mcp_command']}, so "
            "it may be attached only when the daemon is started with --allow-process-agents"
        )
    return {server.name: server for server in servers}
