"""``POST /v1/graph-runs`` with ``flow_name``: a run of the graph a flow's name has now.

The name is resolved once, as the call is taken: the head records the graph's hash (and the label
``salvor.flow`` the name), so recovery, resume and forks walk that graph even after the name has
moved on to a later version.
"""

from __future__ import annotations

from salvor.protocol import MAX_LABELS

from ..flows import FLOW_LABEL
from ..web import bad_request
from ._linked_runs import linked_labels


async def start_named_flow(runtime, flow_name: str, body: dict) -> str:
    """Start a run of the current version of the flow ``flow_name``; its head is durable once
    this returns.

    Raises:
        OperationRefused: bad_request (not a flow name; no room for the daemon's label),
            unknown_flow, or what starting a run of its graph raises; nothing was recorded.
    """
    labels = dict(linked_labels(body.get("labels"), None) or {})
    if len(labels) >= MAX_LABELS:
        raise bad_request(
            f"a run started by `flow_name` carries the daemon's label `{FLOW_LABEL}`, so the "
            f"caller may set at most {MAX_LABELS - 1} labels here, not {len(labels)}"
        )
    namespace, name, current = await runtime.definitions.flow_names.current(flow_name)
    labels[FLOW_LABEL] = f"{namespace}/{name}"
    graph = await runtime.definitions.load_graph(current.graph_hash)
    return await runtime.starts.start_graph_run(graph, body.get("input"), labels=labels)
