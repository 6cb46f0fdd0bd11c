"""A pinned agent node's baseline file: where it lies and what shape it has. Pure: nothing here
opens a path (the run's files hold its bytes)."""

from __future__ import annotations

from typing import Any

from salvor.protocol import FlowBundle


def calls_baseline_path(bundle: FlowBundle, node_id: str) -> str:
    """Where the pinned agent node ``node_id`` of the flow of ``bundle`` keeps its calls:
    ``__baselines__/<flow stem>/<node id>.calls.json``, placed as a snapshot's baseline."""
    return bundle.baseline_path(f"{node_id}.calls")


def _call_problem(call: Any) -> str | None:
    if not isinstance(call, dict):
        return "is not an object"
    kind = call.get("kind")
    if kind == "model":
        if not isinstance(call.get("response"), dict) or not isinstance(call.get("usage"), dict):
            return "is a model call without an object response and usage"
        if not isinstance(call.get("request"), dict) and not isinstance(
            call.get("request_hash"), str
        ):
            return "is a model call without its request or request_hash"
        return None
    if kind == "tool":
        if not isinstance(call.get("tool"), str) or "input" not in call or "output" not in call:
            return "is a tool call without its tool, input and output"
        return None
    return 'has a kind other than "model" or "tool"'


def baseline_calls(document: Any) -> tuple[list[dict] | None, str | None]:
    """The calls of a pinned node's baseline document, or None and what is wrong with it."""
    if not isinstance(document, dict) or not isinstance(document.get("calls"), list):
        return None, 'it is not an object with a list of "calls"'
    for index, call in enumerate(document["calls"]):
        problem = _call_problem(call)
        if problem is not None:
            return None, f"calls[{index}] {problem}"
    return document["calls"], None
