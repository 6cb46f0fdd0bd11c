"""``GET /v1/tools``: the tools this daemon's graph nodes may call, each with its effect and the
file inputs it declares, so a client knows which arguments of a flow's tool nodes are files it
sends with the call."""

from __future__ import annotations

from quart_trio import QuartTrio

from ._answers import TOOLS
from ._operation import Operation, route
from ._state import ServerState

TOOLS_LIST = Operation(
    method="get",
    rule="/v1/tools",
    operation_id="listTools",
    tag="graphs",
    summary="The tools a graph's tool nodes may call here, and the file inputs each declares",
    description=(
        "The daemon's registry, by name. A tool's `file_inputs` name the arguments whose value "
        "is a file it reads: `salvor graph run FILE --remote URL` sends each such argument a "
        "flow's tool node writes as a literal absolute `.json`, `.yaml`, `.png` or `.txt` path "
        "as a `tool` member, and the daemon hands the tool a temporary copy."
    ),
    answers={"200": ("The tools, sorted by name.", TOOLS)},
)
OPERATIONS = (TOOLS_LIST,)


def add_tool_routes(app: QuartTrio, state: ServerState) -> None:
    @route(app, TOOLS_LIST)
    async def list_tools():
        return TOOLS.respond(200, tools=state.runtime.kit.registry.listing())
