"""Refusals of run operations, each naming its code from the one table.

The table is ``salvor.protocol.ErrorCode``.

The CLI prints its one sentence and exits non-zero; the HTTP layer renders
``to_json()`` as the one error envelope. Each words a refusal's next step as
its own action (``HTTP_WORDING`` here, the CLI's own). A refusal always means
nothing was recorded.
"""

from __future__ import annotations

import re

from salvor.protocol import HASH_PATTERN, CodedError, ErrorCode, NextStep, StepKind, excerpt

# A well-formed agent hash is quoted whole (it is what the caller copies); anything else is cut.
_AGENT_HASH = re.compile(HASH_PATTERN)


class OperationRefused(CodedError):
    """A verb refused before it recorded anything.

    Its code is per refusal, its status that code's.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        details: dict | None = None,
        next_step: NextStep | None = None,
    ):
        if not isinstance(code, ErrorCode):
            raise TypeError(f"a refusal names its code as an ErrorCode member, not {code!r}")
        super().__init__(message, details=details, next_step=next_step)
        self.code = code


def internal() -> OperationRefused:
    """What a client hears of a bug: the details go to the daemon's log, not over the wire."""
    return OperationRefused(ErrorCode.INTERNAL, "the server hit an unexpected error; see its log")


def unknown_run(run_id: str) -> OperationRefused:
    return OperationRefused(ErrorCode.UNKNOWN_RUN, f"no run {excerpt(run_id)} in this store")


def unknown_agent(agent: str) -> OperationRefused:
    return OperationRefused(
        ErrorCode.UNKNOWN_AGENT,
        f"no agent {agent if _AGENT_HASH.match(str(agent)) else excerpt(agent)} is stored here",
        next_step=NextStep(kind=StepKind.REGISTER_AGENT),
    )


def unknown_graph(graph: str) -> OperationRefused:
    return OperationRefused(
        ErrorCode.UNKNOWN_GRAPH,
        f"no graph {excerpt(graph)} is stored here; submit its document with POST /v1/graphs",
    )


def bad_request(
    message: str, *, details: dict | None = None, next_step: NextStep | None = None
) -> OperationRefused:
    return OperationRefused(ErrorCode.BAD_REQUEST, message, details=details, next_step=next_step)


def request_timeout(seconds: float | None) -> OperationRefused:
    """A body that stalled: the request is answered and dropped, and nothing of it was used."""
    return OperationRefused(
        ErrorCode.REQUEST_TIMEOUT,
        f"the request body did not arrive whole within {seconds:g} seconds",
    )


def wrong_state(message: str, *, next_step: NextStep | None = None) -> OperationRefused:
    return OperationRefused(ErrorCode.WRONG_STATE, message, next_step=next_step)


def port_held(port: int, holder: str) -> OperationRefused:
    return OperationRefused(
        ErrorCode.PORT_HELD,
        f"the service agent's proxy port {port} is held by run {holder}, which this daemon is "
        "driving; a service's model calls can belong to one run at a time, so start this run once "
        "that one has ended",
        details={"port": port, "run": holder},
    )
