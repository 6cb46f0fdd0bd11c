"""The words ``flow_results`` takes beyond a run's own tree, and its refusal of one nothing
answers to.

A graph run started by a flow's name (``POST /v1/graph-runs`` with ``flow_name``, ``salvor graph
run NS/NAME``) carries that name in its head's ``salvor.flow`` label, and is nobody's child: the
operator starts it, often after an agent wrote the flow with ``flow_write``. So ``flow`` naming a
``namespace/name`` finds the newest run of that flow when the run's tree holds none: the
counterpart of reading a flow's latest run by the flow's name. Only a run started by that name
answers to it, so naming a flow reads nothing but its own runs.
"""

from __future__ import annotations

import difflib

from salvor.protocol import BadFlowName, split_flow_name
from salvor.store import EventStore, RunSummary

from ..flows import FLOW_LABEL
from ..tools import ToolFailed


def flow_name_of(run: RunSummary) -> str | None:
    """The ``namespace/name`` a graph run was started by, None for any other run."""
    return (run.labels or {}).get(FLOW_LABEL)


def newest_run_of_flow(store: EventStore, flow: str) -> RunSummary | None:
    """The newest graph run started by the flow name ``flow``; None when ``flow`` is no flow
    name or no run was started by it. Reads one row."""
    try:
        split_flow_name(flow)
    except BadFlowName:
        return None
    page, _ = store.list_runs(label=(FLOW_LABEL, flow), limit=1)
    return page[0] if page else None


def unknown_word(message: str, word: str, known: list[str]) -> ToolFailed:
    """The call's error for ``word``, which nothing answers to: ``message``, what does
    (``known``, the first 20), and the nearest of them."""
    if not known:
        return ToolFailed(f"{message}: it has started no runs yet", retryable=False)
    shown = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
    # difflib's cost grows with the square of the lengths: no guess for a long word.
    close = difflib.get_close_matches(word, known, n=1) if len(word) <= 128 else []
    guess = close[0] if close else None
    hint = f"; did you mean {guess!r}?" if guess else ""
    return ToolFailed(f"{message}; it has: {shown}{hint}", retryable=False)
