"""Refusals of run operations, in the control plane's code/status vocabulary.

The CLI prints ``message`` as one sentence and exits non-zero; the HTTP layer
renders ``to_json()`` as the one error envelope. A refusal
always means nothing was recorded.
"""

from __future__ import annotations

from salvor.protocol import CodedError, excerpt


class OperationRefused(CodedError):
    """A verb refused before it recorded anything; its code and status are per refusal."""

    def __init__(self, code: str, status: int, message: str, *, details: dict | None = None):
        super().__init__(message, details=details)
        self.code = code
        self.status = status


def internal() -> OperationRefused:
    """What a client hears of a bug: the details go to the daemon's log, not over the wire."""
    return OperationRefused("internal", 500, "the server hit an unexpected error; see its log")


def unknown_run(run_id: str) -> OperationRefused:
    return OperationRefused("unknown_run", 404, f"no run {excerpt(run_id)} in this store")


def unknown_agent(agent: str) -> OperationRefused:
    return OperationRefused(
        "unknown_agent",
        404,
        f"no agent {excerpt(agent)} is stored here; run it once with `salvor "
        "run AGENT_FILE` to register it",
    )


def bad_request(message: str, *, details: dict | None = None) -> OperationRefused:
    return OperationRefused("bad_request", 400, message, details=details)


def request_timeout(seconds: float | None) -> OperationRefused:
    """A body that stalled: the request is answered and dropped, and nothing of it was used."""
    return OperationRefused(
        "request_timeout", 408, f"the request body did not arrive whole within {seconds:g} seconds"
    )


def wrong_state(message: str) -> OperationRefused:
    return OperationRefused("wrong_state", 409, message)


def port_held(port: int, holder: str) -> OperationRefused:
    return OperationRefused(
        "port_held",
        409,
        f"the service agent's proxy port {port} is held by run {holder}, which this daemon is "
        "driving; a service's model calls can belong to one run at a time, so start "
        "this run once that one has ended",
        details={"port": port, "run": holder},
    )
