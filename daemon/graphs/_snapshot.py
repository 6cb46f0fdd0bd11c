"""A ``snapshot`` node: a value of the walk held against its baseline file, found among the run's
files by its path (``__baselines__/<flow stem>/<name>.json`` beside the flow's real file).

Comparing, an equal value is the node's output and anything else fails the run naming the
snapshot and the first difference; a run that updates its baselines records the value instead,
for the client to write once the run has ended. Within one call, a baseline an earlier snapshot
captured is the one a later snapshot compares with, in any run of the call. Pure: nothing here
opens a path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from salvor.protocol import GraphNode, canonical_json, excerpt

from ._flow_check import FlowFiles

# What a snapshot node that captured its baseline answers with (``baseline``'s value).
CAPTURED = "captured"
# What the client then does with the path (``client``'s value): it has no file there yet, or
# it has one (sent, listed, or captured by an earlier snapshot of the same call).
WRITES, UPDATES = "writes", "updates"


def _shown(value: Any) -> str:
    return excerpt(json.dumps(value, ensure_ascii=False), 80)


def first_difference(baseline: Any, value: Any, at: str = "$") -> str | None:
    """Where ``value`` first differs from ``baseline`` (keys in sorted order), or None."""
    if isinstance(baseline, dict) and isinstance(value, dict):
        for key in sorted(baseline.keys() | value.keys()):
            if key not in value:
                return f"at {at}.{key} the baseline has {_shown(baseline[key])}, the run nothing"
            if key not in baseline:
                return f"at {at}.{key} the run has {_shown(value[key])}, the baseline nothing"
            found = first_difference(baseline[key], value[key], f"{at}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(baseline, list) and isinstance(value, list):
        for index, (old, new) in enumerate(zip(baseline, value, strict=False)):
            found = first_difference(old, new, f"{at}[{index}]")
            if found is not None:
                return found
        if len(baseline) != len(value):
            return f"at {at} the baseline has {len(baseline)} items, the run {len(value)}"
        return None
    if canonical_json(baseline) == canonical_json(value):
        return None
    return f"at {at} the baseline has {_shown(baseline)}, the run {_shown(value)}"


def read_baseline(files: FlowFiles, path: str, what: str) -> tuple[Any, str | None]:
    """The JSON value of the baseline at ``path`` among the run's files, or why there is none
    usable (``what`` names its holder: "snapshot 'reply'"; then the value is None)."""
    member = files.bundle.members.get(path)
    if member is None or member.state in ("missing", "listed"):
        return None, (
            f"{what} has no baseline at {path}; run the flow with --update-baselines to capture it"
        )
    if member.state == "refused":
        return None, f"{what}: {member.error}"
    data = files.member_bytes(member)
    try:
        return (json.loads(data) if data is not None else None), None
    except ValueError:
        return None, f"{what}: the baseline {path} is not JSON"


def snapshot_outcome(
    files: FlowFiles | None,
    node: GraphNode,
    value: Any,
    captured: Mapping[str, Any] | None = None,
) -> tuple[Any, str | None]:
    """The snapshot node's output, or why it fails the run (then the output is None).

    ``captured``: the baselines earlier snapshots of the same call captured, by path
    (``call_captures``); a comparing snapshot reads such a capture before the client's file, and
    a capturing one says whether the client then writes its file or updates one (``client``).
    """
    if files is None:
        return None, "a snapshot runs only in a run of a flow file, which brings its baselines"
    captured = captured or {}
    path = files.bundle.baseline_path(node.name)
    member = files.bundle.members.get(path)
    if files.bundle.update_baselines:
        # A refused one is the client's to refuse writing once the run ends.
        there = path in captured or (member is not None and member.state in (None, "listed"))
        client = UPDATES if there else WRITES
        return {"baseline": CAPTURED, "path": path, "value": value, "client": client}, None
    if path in captured:
        baseline = captured[path]
    else:
        found, problem = read_baseline(files, path, f"snapshot {node.name!r}")
        if problem is not None:
            return None, problem
        baseline = found
    difference = first_difference(baseline, value)
    if difference is not None:
        return None, f"snapshot {node.name!r} differs from its baseline {path}: {difference}"
    return value, None
