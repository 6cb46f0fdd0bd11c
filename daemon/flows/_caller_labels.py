"""The one check of labels a caller supplies (POST /v1/runs and /v1/graph-runs, a client run's
RunStarted, ``salvor run --label`` and its siblings): the bounds every label meets, and the
flow labels' rules — ``salvor.parent``, ``salvor.map_of``, ``salvor.linked`` and ``salvor.flow``
are written by the daemon alone, ``salvor.autonomous`` is ``"true"`` or ``"false"``.

The daemon's own heads (a map item's, a subagent child's) carry the daemon's labels and are not
checked here: they never come through a door.
"""

from __future__ import annotations

from typing import Any

from ..recording import checked_labels
from ..web import bad_request
from ._session import (
    AUTONOMOUS_LABEL,
    DAEMON_LABELS,
    FLOW_LABEL,
    LINKED_LABEL,
    MAP_OF_LABEL,
    PARENT_LABEL,
)

_WHY = {
    PARENT_LABEL: "a subagent's child run names its parent with it",
    MAP_OF_LABEL: "a map's item run names its graph run with it",
    LINKED_LABEL: "a run sent with X-Salvor-Linked names its client's project with it",
    FLOW_LABEL: "a graph run started by a flow's name carries the name in it",
}


def caller_labels(labels: Any, where: str = "") -> dict[str, str] | None:
    """``labels`` a caller supplied, when they pass the bounds and the flow labels' rules.

    Raises:
        OperationRefused: bad_request with one sentence, after ``where`` (say
            ``"events[0]: "``); the caller records nothing.
    """
    checked_labels(labels, where)
    if labels is None:
        return None
    reserved = sorted(DAEMON_LABELS & set(labels))
    if reserved:
        key = reserved[0]
        raise bad_request(
            f"{where}the label `{key}` is written by the daemon alone ({_WHY[key]}); "
            "choose another key"
        )
    autonomous = labels.get(AUTONOMOUS_LABEL)
    if autonomous is not None and autonomous not in ("true", "false"):
        raise bad_request(
            f'{where}the label `{AUTONOMOUS_LABEL}` is "true" (nobody answers questions in this '
            f'run tree) or "false", not {autonomous!r}'
        )
    return labels
