"""How a process agent's model calls sit in its log, and how a later request differs from them.

Each model call is a ``ModelCallRequested`` (its request's hash, and its body when prompts are
recorded) and, once answered, a ``ModelCallCompleted`` (the JSON body, or the stream's SSE
frames in order). A request matches the call recorded at its position when its hashed
envelope does and it asks for the same streaming mode; a replay lane
(``salvor.protocol.ReplayLane``) holds the calls in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from salvor.protocol import CallNames, DivergenceReason, Envelope, EventKind, Mismatch

from ._wire import divergence_report


@dataclass(slots=True)
class ModelCall:
    """One model call of the log (``Recorded`` for the replay lane)."""

    seq: int
    request_hash: str
    request: dict | None
    response: dict | None

    @property
    def completed(self) -> bool:
        return self.response is not None

    @property
    def effect(self) -> None:
        return None  # a model call has no effect: an open one is issued again


MODEL_CALLS = CallNames(one="model call", many="model calls")


def model_match(
    asked: dict, request_hash: str, stream: bool
) -> Callable[[ModelCall], Mismatch | None]:
    """How a recorded call differs from a request (its hashed envelope ``asked``): the
    hash, then the streaming mode."""

    def match(call: ModelCall) -> Mismatch | None:
        if call.request_hash != request_hash:
            recorded_model = None
            if call.response is not None and isinstance(call.response.get("body"), dict):
                recorded_model = call.response["body"].get("model")
            return Mismatch(
                DivergenceReason.REQUEST, divergence_report(asked, call.request, recorded_model)
            )
        if call.response is not None and ("frames" in call.response) != stream:
            how = "as a stream" if "frames" in call.response else "without streaming"
            return Mismatch(
                DivergenceReason.REQUEST,
                (
                    f"it was recorded {how}; the agent now asks "
                    f"{'with' if stream else 'without'} streaming"
                ),
            )
        return None

    return match


def recorded_calls(log_: Sequence[Envelope]) -> list[ModelCall]:
    """The model calls of a log in order, each with its response once completed."""
    calls: list[ModelCall] = []
    by_seq: dict[int, ModelCall] = {}
    for env in log_:
        if env.event.KIND is EventKind.MODEL_CALL_REQUESTED:
            call = ModelCall(env.seq, env.event.request_hash, env.event.request_body, None)
            calls.append(call)
            by_seq[env.seq] = call
        elif env.event.KIND is EventKind.MODEL_CALL_COMPLETED and env.event.seq in by_seq:
            by_seq[env.event.seq].response = env.event.response
    return calls
