"""The ``--attachable-mcp FILE`` the command line reads: ``salvor serve``'s (every server held to
the operator's declarations) and ``salvor tools attach``'s (where each ``--mcp`` name is
declared)."""

from __future__ import annotations

import argparse

from ..agents import AttachableError, Credentials, load_attachable_servers
from ._errors import UsageError


def read_attachable(path: str, credentials: Credentials | None, allow_processes: bool) -> dict:
    """The servers ``path`` declares, by name.

    Raises:
        UsageError: the file cannot be used (``AttachableError``'s sentence); nothing opened.
    """
    try:
        return dict(load_attachable_servers(path, credentials, allow_processes))
    except AttachableError as exc:
        raise UsageError(str(exc)) from None


def attachable_servers(args: argparse.Namespace) -> dict:
    """``salvor tools attach``'s declared servers (none without ``--attachable-mcp``).

    Raises:
        UsageError: nothing to attach, ``--mcp`` without the file, or a file that cannot be used.
    """
    if not args.tool and not args.mcp:
        raise UsageError("name a registry TOOL or an MCP server with --mcp NAME to attach")
    if args.attachable_mcp is None:
        if args.mcp:
            raise UsageError(
                "--mcp needs --attachable-mcp FILE, the file the daemon serves with, where the "
                "server's name is declared"
            )
        return {}
    return read_attachable(args.attachable_mcp, None, allow_processes=True)
