"""``salvor graph run NAMESPACE/NAME``: a run of a flow kept by name in the local store (or, with
``--remote``, in the daemon's: ``_remote_flow``).

``FILE`` is read as a flow's name only when no file is there and it is ``namespace/name``: a path
that exists is always a file, so a flow named like a directory never hides one. The name is
resolved once, before the run starts: the run walks that version's graph whatever the name holds
later, and carries the label ``salvor.flow``.
"""

from __future__ import annotations

import argparse

import trio
from salvor.protocol import MAX_LABELS, BadFlowName, ErrorCode, Graph, split_flow_name

from ..flows import FLOW_LABEL
from ..runs import Runtime
from ..web import OperationRefused
from ._errors import CliError, UsageError


async def names_a_flow(args: argparse.Namespace) -> bool:
    """Whether ``args.file`` is read as a flow's name: no file is there and it is
    ``namespace/name``.

    Raises:
        UsageError: ``--update-baselines`` with a name (a stored graph has no files beside it).
    """
    if await trio.Path(args.file).exists():
        return False
    try:
        split_flow_name(args.file)
    except BadFlowName:
        return False
    if args.update_baselines:
        raise UsageError(
            f"--update-baselines: {args.file} is a flow kept by name, with no files beside it; "
            "run its flow file instead"
        )
    return True


async def by_flow_name(
    runtime: Runtime, args: argparse.Namespace, labels: dict | None
) -> tuple[Graph, dict] | None:
    """The graph of the flow ``args.file`` names and the run's labels with ``salvor.flow``, or
    None when ``args.file`` is a path (or no flow name) and is read as a file.

    Raises:
        UsageError: ``--update-baselines`` with a name (``names_a_flow``), or labels that leave
            no room for the daemon's.
        CliError: the store keeps no flow by that name (and there is no such file).
    """
    if not await names_a_flow(args):
        return None
    labels = dict(labels or {})
    if len(labels) >= MAX_LABELS:
        raise UsageError(
            f"a run of a flow by name carries the label `{FLOW_LABEL}`, so give at most "
            f"{MAX_LABELS - 1} --label, not {len(labels)}"
        )
    try:
        namespace, name, current = await runtime.definitions.flow_names.current(args.file)
    except OperationRefused as exc:
        if exc.code != ErrorCode.UNKNOWN_FLOW:
            raise
        raise CliError(
            f"there is no file {args.file!r}, and no flow is kept as {args.file!r} in this store "
            "(`flow_write` or POST /v1/graphs?name=NAMESPACE/NAME keeps one)"
        ) from None
    labels[FLOW_LABEL] = f"{namespace}/{name}"
    return await runtime.definitions.load_graph(current.graph_hash), labels
