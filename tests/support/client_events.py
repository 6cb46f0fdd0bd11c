"""Events as a client of a client-driven run sends them (``POST /v1/client-runs/{id}/events``)."""

from __future__ import annotations


def envelope(run_id: str, seq: int, kind: str, payload: dict) -> dict:
    """One event of the run's log. ``recorded_at`` is the client's to send and the daemon's to
    overwrite with its own clock."""
    return {
        "run_id": run_id,
        "seq": seq,
        "schema_version": 1,
        "recorded_at": "1970-01-01T00:00:00.000000Z",
        "event": {"kind": kind, "payload": payload},
    }


def run_started(run_id: str, agent: str, labels: dict | None = None) -> dict:
    """The run's head: started by ``agent`` with no input (and ``labels``, when given)."""
    payload = {"agent_def_hash": agent, "input": None}
    if labels is not None:
        payload["labels"] = labels
    return envelope(run_id, 0, "RunStarted", payload)
