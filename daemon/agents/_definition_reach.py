"""What a definition may make the daemon run or reach, and who allows it.

Two gates, both for a definition that arrives over HTTP (an agent file the operator runs passes
both): the operator's opt-in (``--allow-process-agents``) for whatever runs a command on the
daemon's machine, binds a port or sends the daemon's own environment to a URL; and the operator's
declarations (``Credentials.check_reach``) for every URL, variable and key a definition names.
"""

from __future__ import annotations

from ..mcp import McpServerSpec
from ..web import stray_placeholder
from ._agent_definition import AgentDefinition
from ._credentials import Credentials, Undeclared
from ._definition_error import DefinitionError
from ._definition_rules import expect

# Why each kind needs the operator's opt-in before it is accepted over HTTP.
OPT_IN_REASONS = {
    "process": "process agents run a command on the daemon's machine",
    "service": "service agents make the daemon bind a loopback port and POST to a URL",
    "mcp_command": "an MCP server with `command` makes the daemon run a command on its machine",
    "mcp_secret": (
        "an MCP server whose headers name `${VAR}` (or `bearer_token_env`) sends the "
        "daemon's own environment to a URL"
    ),
}


def require_opt_in(kind: str, allow_processes: bool) -> None:
    """A process or a service agent, refused unless the operator opted in."""
    expect(
        allow_processes,
        f"{OPT_IN_REASONS[kind]}, so this daemon accepts them over "
        "HTTP only when started with --allow-process-agents",
        ("kind",),
    )


def check_mcp_opt_ins(
    mcp_servers: tuple[McpServerSpec, ...], credentials: Credentials | None, allow_processes: bool
) -> None:
    """A built-in agent's MCP servers, each held to the operator's declarations (an HTTP
    caller's: ``check_reach``) or to the process opt-in (a command, a header reading the
    environment)."""
    for index, server in enumerate(mcp_servers):
        at = ("mcp_servers", index)
        if credentials is not None and server.url is not None:
            # The operator's declarations decide (``check_reach``), before registration
            # contacts the server.
            continue
        reason = (
            "mcp_command"
            if server.command is not None
            else "mcp_secret"
            if server.reads_environment()
            else None
        )
        expect(
            reason is None or allow_processes,
            f"[[mcp_servers]] {server.name!r}: {OPT_IN_REASONS[reason] if reason else ''}, so "
            "this daemon accepts it over HTTP only when started with --allow-process-agents",
            at,
        )


def check_placeholders(where: str, value: str, at: tuple[str | int, ...]) -> None:
    expect(
        not stray_placeholder(value),
        f"{where} has a `${{` that is not a well-formed `${{NAME}}` placeholder",
        at,
    )


def reached(agent: AgentDefinition, credentials: Credentials | None) -> AgentDefinition:
    """``agent``, once the operator's declarations allow every URL, variable and key it names
    (``Credentials.check_reach``, the one rule for every kind); no check without them."""
    if credentials is not None:
        try:
            credentials.check_reach(agent)
        except Undeclared as exc:
            raise DefinitionError(str(exc), at=exc.at) from None
    return agent
