"""A RunView as JSON text and back, so a driver can resume from a ``runs`` row.

The JSON holds every field of the view (and of its pending intent) under the
field's own name. Reading is strict: a missing or unknown field is an error,
never a silent default, because a view that is quietly wrong would let a
driver append against the wrong state. A protocol change that adds a field to
RunView therefore comes with a store schema step that re-folds the rows.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from salvor.protocol import Actor, Pending, PendingKind, RunState, RunView

_VIEW_FIELDS = tuple(f.name for f in fields(RunView))
_PENDING_FIELDS = tuple(f.name for f in fields(Pending))
_VIEW_KEYS = frozenset(_VIEW_FIELDS)
_PENDING_KEYS = frozenset(_PENDING_FIELDS)

dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def pending_to_json(pending: Pending) -> dict:
    """Every field of a pending intent (more than ``Pending.to_json``, which is the API shape)."""
    return {name: getattr(pending, name) for name in _PENDING_FIELDS}


def view_to_json(view: RunView) -> dict:
    """Every field of ``view`` as a JSON object; ``view_from_json`` reverses it exactly."""
    body = {name: getattr(view, name) for name in _VIEW_FIELDS}
    body["state"] = view.state.value
    if view.pending is not None:
        body["pending"] = pending_to_json(view.pending)
    return body


def view_from_json(data: Any) -> RunView:
    """Rebuild a RunView from ``view_to_json``'s object.

    Raises:
        ValueError: the object is not a complete view (a field is missing or
            unknown, or the state, a pending kind or an actor is not one).
        TypeError: a field has the wrong type.
    """
    if not isinstance(data, dict) or data.keys() != _VIEW_KEYS:
        raise ValueError("the stored view does not have exactly RunView's fields")
    body = dict(data)
    body["state"] = RunState(body["state"])
    if body["driven_by"] is not None:
        body["driven_by"] = Actor(body["driven_by"])
    pending = body["pending"]
    if pending is not None:
        if not isinstance(pending, dict) or pending.keys() != _PENDING_KEYS:
            raise ValueError("the stored pending intent does not have exactly Pending's fields")
        pending = {**pending, "kind": PendingKind(pending["kind"])}
        if pending["performed_by"] is not None:
            pending["performed_by"] = Actor(pending["performed_by"])
        body["pending"] = Pending(**pending)
    for name in ("detail", "budget_extensions"):
        if not isinstance(body[name], dict):
            raise TypeError(f"the stored view's {name} is not an object")
    for name in ("next_seq", "input_tokens", "output_tokens", "step_count", "tool_calls_completed"):
        if type(body[name]) is not int:
            raise TypeError(f"the stored view's {name} is not an integer")
    return RunView(**body)
