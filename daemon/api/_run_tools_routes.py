"""``POST /v1/runs/{id}/tools``: the operator attaches registry tools and declared MCP servers to
a run tree at run time.

Behind the same front as every route (token, Host and Origin rules). The body names registry
tools and servers of ``--attachable-mcp`` only: a URL, a command or a server's table in it is
refused (``AttachTools`` is closed, a server is a name), so a caller never chooses where the
daemon connects, what it spawns or which secret it sends.
"""

from __future__ import annotations

from quart_trio import QuartTrio

from ..recording import parse_run_id
from ._answers import TOOLS_ATTACHED
from ._bodies import ATTACH_TOOLS
from ._operation import RUN_ID, Operation, error, route
from ._state import ServerState, refuse_if_driven_elsewhere

ATTACH_TOOLS_OP = Operation(
    method="post",
    rule="/v1/runs/<run_id>/tools",
    operation_id="attachRunTools",
    tag="runs",
    summary="Attach registry tools and declared MCP servers to a run and the children it starts",
    description=(
        "Records ToolsAttached in the run's log and in each of its children that has not ended, "
        "each while it rests (a drive holding it is waited for a few seconds); a server is "
        "recorded by name, as mcp:NAME, and reached as the operator's --attachable-mcp file "
        "declares it when a drive connects. A built-in agent offers the tools (a server's as its "
        "recorded listing gives them) from its next model call, a process agent's salvor MCP "
        "server lists the registry tools from its next drive, and every child started "
        "afterwards inherits them. Recovery, a restart and a fork read them from the log."
    ),
    parameters=RUN_ID,
    body=ATTACH_TOOLS,
    answers={"200": ("Attached.", TOOLS_ATTACHED)},
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge"),
    responses={
        "404": error(
            "No run under that id, a tool the registry does not have, or a server the operator "
            "did not declare with --attachable-mcp. Nothing recorded.",
            "unknown_run",
            "unknown_tool",
            "unknown_mcp_server",
        ),
        "409": error(
            "The run has ended, is client-driven, or a drive held it past the wait. Nothing "
            "recorded.",
            "wrong_state",
            "client_driven_run",
        ),
    },
)
OPERATIONS = (ATTACH_TOOLS_OP,)


def add_run_tools_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, ATTACH_TOOLS_OP)
    async def attach_tools(run_id: str):
        run_id = parse_run_id(run_id)
        body = await ATTACH_TOOLS.read()
        await refuse_if_driven_elsewhere(state, run_id)
        attached = await runtime.tools.attach(
            run_id, body.get("tools", []), body.get("mcp_servers", [])
        )
        return TOOLS_ATTACHED.respond(
            run=run_id, tools=attached["tools"], runs=attached["runs"], busy=attached["busy"]
        )
