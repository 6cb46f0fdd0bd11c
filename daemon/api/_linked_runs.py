"""``X-Salvor-Linked: 1`` on ``POST /v1/graph-runs``: the caller is a client on the project's
machine (``salvor graph run --remote``), so the run tree is marked linked in its head, with the
label ``salvor.linked`` naming the client's project root. Every child the daemon starts for the
run inherits it, and recovery, waking and forks read it from the heads: what the tree's agents
author is saved on the client, never on this daemon (``runs.ClientSaves``).

The project is ``P`` of the flow file's real path ``<P>/.salvor/flows/<name>.yaml`` (else of the
path it was run by); a flow in no project, a graph by hash, or a project path longer than a
label holds is marked with an empty value, and its authoring calls are refused saying so.
"""

from __future__ import annotations

from quart import request
from salvor.protocol import MAX_LABEL_VALUE_BYTES, MAX_LABELS, FlowBundle, project_of

from ..flows import LINKED_LABEL
from ..web import bad_request

LINKED_HEADER = "X-Salvor-Linked"


def linked_labels(labels: dict[str, str] | None, bundle: FlowBundle | None) -> dict | None:
    """The run's labels: the caller's, and ``salvor.linked`` when the call came over a link.

    Raises:
        OperationRefused: bad_request when the caller's labels leave no room for the daemon's;
            nothing was recorded.
    """
    if request.headers.get(LINKED_HEADER) != "1":
        return labels
    labels = dict(labels or {})
    if len(labels) >= MAX_LABELS:
        raise bad_request(
            f"a run sent with {LINKED_HEADER} carries the daemon's label `{LINKED_LABEL}`, so "
            f"the caller may set at most {MAX_LABELS - 1} labels, not {len(labels)}"
        )
    project = None if bundle is None else project_of(bundle.canonical, bundle.path)
    if project is None or len(project.encode()) > MAX_LABEL_VALUE_BYTES:
        project = ""
    labels[LINKED_LABEL] = project
    return labels
