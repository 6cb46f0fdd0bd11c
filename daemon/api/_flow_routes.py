"""``/v1/flows``: the flows kept by name (``flow_write``, ``POST /v1/graphs?name=``), listed at
their current versions, and one of them with every version it has had. Read only: a name is
written with its graph, by ``POST /v1/graphs?name=NAMESPACE/NAME``.
"""

from __future__ import annotations

from quart_trio import QuartTrio
from salvor.store import FlowVersion, NamedFlow

from ._graph_schemas import FLOW, FLOW_LIST, FLOW_SUMMARY, FLOW_VERSION
from ._operation import Operation, error, route
from ._state import ServerState

_PART = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"}

LIST = Operation(
    method="get",
    rule="/v1/flows",
    operation_id="listFlows",
    tag="graphs",
    summary="List the flows kept by name, each at its current version",
    answers={"200": ("The named flows, by namespace and name.", FLOW_LIST)},
)
READ = Operation(
    method="get",
    rule="/v1/flows/<namespace>/<name>",
    operation_id="getFlow",
    tag="graphs",
    summary="Read one named flow with every version it has had",
    parameters=(
        {"name": "namespace", "in": "path", "required": True, "schema": _PART},
        {"name": "name", "in": "path", "required": True, "schema": _PART},
    ),
    answers={"200": ("The flow and its versions, oldest first.", FLOW)},
    responses={"404": error("No flow is kept under that name.", "unknown_flow")},
)
OPERATIONS = (LIST, READ)


def _summary(flow: NamedFlow) -> dict:
    return {
        "flow": f"{flow.namespace}/{flow.name}",
        "namespace": flow.namespace,
        "name": flow.name,
        "graph": flow.graph_hash,
        "version": flow.version,
        "updated_at": flow.updated_at,
    }


def _version(version: FlowVersion) -> dict:
    body = {
        "version": version.version,
        "graph": version.graph_hash,
        "created_at": version.created_at,
    }
    if version.run_id is not None:
        body["run"] = version.run_id
    return FLOW_VERSION.body(**body)


def add_flow_routes(app: QuartTrio, state: ServerState) -> None:
    names = state.runtime.definitions.flow_names

    @route(app, LIST)
    async def list_flows():
        flows = await names.list()
        return FLOW_LIST.respond(flows=[FLOW_SUMMARY.body(**_summary(flow)) for flow in flows])

    @route(app, READ)
    async def get_flow(namespace: str, name: str):
        versions = await names.versions(namespace, name)
        current = versions[-1]
        summary = NamedFlow(
            namespace, name, current.version, current.graph_hash, current.created_at
        )
        return FLOW.respond(**_summary(summary), versions=[_version(v) for v in versions])
