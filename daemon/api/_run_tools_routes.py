"""``POST /v1/runs/{id}/tools``: the operator attaches registry tools to a run tree at run time.

Behind the same front as every route (token, Host and Origin rules). The body names registry
tools only: a URL, a command or an MCP server in it is refused (``AttachTools`` is closed), so a
caller never chooses where the daemon connects or which secret it sends.
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
    summary="Attach registry tools to a run and the children it starts",
    description=(
        "Records ToolsAttached in the run's log and in each of its children that has not ended, "
        "each while it rests (a drive holding it is waited for a few seconds). A built-in agent "
        "offers the tools from its next model call, a process agent's salvor MCP server lists "
        "them from its next drive, and every child started afterwards inherits them. Recovery, "
        "a restart and a fork read them from the log."
    ),
    parameters=RUN_ID,
    body=ATTACH_TOOLS,
    answers={"200": ("Attached.", TOOLS_ATTACHED)},
    refusals=("BadRequest", "UnknownRun", "PayloadTooLarge"),
    responses={
        "404": error(
            "No run under that id, or a tool the registry does not have. Nothing recorded.",
            "unknown_run",
            "unknown_tool",
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
        attached = await runtime.tools.attach(run_id, body["tools"])
        return TOOLS_ATTACHED.respond(
            run=run_id, tools=attached["tools"], runs=attached["runs"], busy=attached["busy"]
        )
