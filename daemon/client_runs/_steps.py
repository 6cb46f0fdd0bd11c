"""The steps a client-driven run asks the daemon to perform: a model call, a registry tool call.

The client owns the loop and reserves the position (``seq``) of each intent;
the daemon holds the key or the code, records the intent write-ahead,
performs the step and records its completion. A step is retried by its
identity at ``seq``: a completed step answers from the log and is never
performed again; a dangling model intent, read or idempotent intent is
performed again (an idempotent one under its recorded key); a dangling write
is ``needs_reconciliation``. Anything else at ``seq`` is a divergence.

A refusal before the intent is recorded leaves the run as it was; a failure
of the step itself leaves the intent dangling, which is the legal crash state.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from salvor.protocol import (
    EMPTY_VIEW,
    Actor,
    Envelope,
    ErrorCode,
    EventKind,
    GuardRefusal,
    ModelCallCompleted,
    ModelCallRequested,
    RunView,
    SchemaViolation,
    ToolCallCompleted,
    ToolCallRequested,
    sha256_hash,
    validate,
)

from ..models import Delta, ModelCallError, ModelGateway, resolve_endpoint
from ..recording import StoreAccess, needs_reconciliation, outcome_output
from ..tools import DispatchFailed, Tool, ToolRegistry, dispatch
from ..web import OperationRefused, bad_request, off_loop
from ._answers import MODEL_STEP_DONE, TOOL_STEP_DONE

_REQUEST_KEYS = {"model", "max_tokens", "messages", "system", "tools"}
# What ``check_model_request`` takes, for the OpenAPI document's schema of a model step's request.
MODEL_REQUEST_FIELDS = frozenset(_REQUEST_KEYS)


@asynccontextmanager
async def open_model_executor(
    environ: Mapping[str, str] = os.environ,
) -> AsyncIterator[ModelGateway | None]:
    """The daemon's own model client for server-performed steps, or None when none is configured.

    It speaks the Messages wire to ``SALVOR_MODEL_BASE_URL`` (else the public
    endpoint) with ``ANTHROPIC_API_KEY``; with neither variable set the daemon
    has no model to offer, and a model step is refused before it records anything.
    """
    if not environ.get("SALVOR_MODEL_BASE_URL") and not environ.get("ANTHROPIC_API_KEY"):
        yield None
        return
    gateway = ModelGateway(resolve_endpoint(provider="anthropic", environ=environ), max_retries=2)
    try:
        yield gateway
    finally:
        await gateway.aclose()


def check_model_request(request: Any) -> None:
    """A neutral model request: model, max_tokens, messages, optional system and tools.

    Raises:
        OperationRefused: bad_request naming what is wrong (nothing is recorded).
    """
    if not isinstance(request, dict):
        raise bad_request("`request` must be a model request object")
    unknown = sorted(set(request) - _REQUEST_KEYS)
    if unknown:
        raise bad_request(
            f"`request` has an unknown field `{unknown[0]}`; it takes "
            f"{', '.join(sorted(_REQUEST_KEYS))}"
        )
    if not isinstance(request.get("model"), str) or not request["model"]:
        raise bad_request("`request.model` must be a non-empty string")
    if type(request.get("max_tokens")) is not int or request["max_tokens"] < 1:
        raise bad_request("`request.max_tokens` must be a positive integer")
    messages = request.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict)
            and m.get("role") in ("user", "assistant")
            and isinstance(m.get("content"), (str, list))
            for m in messages
        )
    ):
        raise bad_request(
            "`request.messages` must be a non-empty array of {role: user|assistant, content}"
        )
    if "system" in request and not isinstance(request["system"], (str, list)):
        raise bad_request("`request.system` must be a string or an array of blocks")
    if "tools" in request and not (
        isinstance(request["tools"], list)
        and all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in request["tools"])
    ):
        raise bad_request("`request.tools` must be an array of tools, each with a `name`")


@dataclass(slots=True)
class _AtSeq:
    """What the log holds at a step's position: nothing yet, or an
    intent and maybe its completion."""

    view: RunView
    intent: Envelope | None = None
    completion: Envelope | None = None


async def at_seq(access: StoreAccess, run_id: str, seq: int) -> _AtSeq:
    view = await access.read(access.store.read_view, run_id) or EMPTY_VIEW
    if seq > view.next_seq:
        raise GuardRefusal(
            f"seq {seq} is beyond the end of run {run_id}'s log (its "
            f"next position is {view.next_seq})"
        )
    found = _AtSeq(view)
    if seq < view.next_seq:
        tail = await access.read(access.store.read_log, run_id, seq)
        found.intent = tail[0]
        found.completion = next(
            (
                e
                for e in tail[1:]
                if e.event.KIND in (EventKind.MODEL_CALL_COMPLETED, EventKind.TOOL_CALL_COMPLETED)
                and e.event.seq == seq
            ),
            None,
        )
    return found


def _dangling(found: _AtSeq, run_id: str, seq: int) -> None:
    """An intent without a completion may be performed again only while
    it is the run's open intent."""
    pending = found.view.pending
    if pending is None or pending.seq != seq:
        raise GuardRefusal(
            f"the intent at seq {seq} of run {run_id} is no longer open ({found.view.state.value})"
        )


@dataclass(slots=True)
class ModelCall:
    """A model step ready to perform (its intent is recorded), or already answered from the log."""

    seq: int
    request: dict
    view: RunView
    answer: dict | None = None


async def open_model_step(
    access: StoreAccess,
    run_id: str,
    seq: int,
    request: Any,
    *,
    record_prompts: bool,
    executor: ModelGateway | None,
) -> ModelCall:
    """Everything before the provider is called: the checks, and the
    intent recorded (or found open).

    Raises:
        OperationRefused: bad_request (not a model request), model_executor_unavailable
            (503; nothing recorded).
        GuardRefusal: divergence at ``seq``.
    """
    check_model_request(request)
    request_hash = sha256_hash(request)
    found = await at_seq(access, run_id, seq)
    view = found.view
    if found.intent is not None:
        event = found.intent.event
        if event.KIND is EventKind.MODEL_CALL_REQUESTED and event.performed_by == Actor.CLIENT:
            # Performing it here would witness a response the log attributes to the client.
            raise GuardRefusal(
                f"the model call at seq {seq} of run {run_id} is the client's own; "
                f"complete it with client-model-completion"
            )
        if event.KIND is not EventKind.MODEL_CALL_REQUESTED or event.request_hash != request_hash:
            raise GuardRefusal(
                f"seq {seq} of run {run_id} holds a {event.KIND.value}"
                + (
                    " for a different request"
                    if event.KIND is EventKind.MODEL_CALL_REQUESTED
                    else ""
                )
                + "; a retry must send the same request to the same position"
            )
        if found.completion is not None:
            done = found.completion.event
            return ModelCall(
                seq, request, view, MODEL_STEP_DONE.build(response=done.response, usage=done.usage)
            )
        _dangling(found, run_id, seq)
    if executor is None:
        raise OperationRefused(
            ErrorCode.MODEL_EXECUTOR_UNAVAILABLE,
            "this daemon has no model to call: start it with SALVOR_MODEL_BASE_URL "
            "(a Messages endpoint) or ANTHROPIC_API_KEY set; nothing was recorded",
        )
    if found.intent is None:
        intent = ModelCallRequested(
            request_hash=request_hash, request_body=request if record_prompts else None
        )
        _, view = await access.append(run_id, [intent], view)
    return ModelCall(seq, request, view)


async def perform_model_step(
    access: StoreAccess,
    run_id: str,
    call: ModelCall,
    executor: ModelGateway,
    *,
    on_delta: Delta | None = None,
) -> dict:
    """Call the provider for an opened step and record the completion; ``{"response", "usage"}``.

    Raises:
        OperationRefused: model_execution (502); the intent stays open and the same step retries it.
    """
    try:
        result = await executor.complete(call.request, on_delta=on_delta)
    except ModelCallError as exc:
        raise OperationRefused(
            ErrorCode.MODEL_EXECUTION,
            f"the model call at seq {call.seq} failed: {exc.message}; "
            "its intent stays open and the same step retries it",
        ) from None
    await access.append(
        run_id,
        [ModelCallCompleted(seq=call.seq, response=result.response, usage=result.usage)],
        call.view,
    )
    return MODEL_STEP_DONE.build(response=result.response, usage=result.usage)


def registry_unavailable(doing: str, *, details: dict | None = None) -> OperationRefused:
    """The refusal of a tool asked of a daemon whose host wired no tool registry (503)."""
    return OperationRefused(
        ErrorCode.TOOL_REGISTRY_UNAVAILABLE,
        f"this daemon has no tool registry (its host wired none), so it cannot {doing}; "
        "nothing was recorded",
        details=details,
    )


async def tool_step(
    access: StoreAccess,
    registry: ToolRegistry,
    run_id: str,
    seq: int,
    name: Any,
    tool_input: Any,
    key: Any,
) -> dict:
    """Perform (or answer from the log) the registry tool call at ``seq``; ``{"output"}``.

    The effect is the registration's, never the client's.

    Raises:
        OperationRefused: bad_request (input the tool's schema rejects), unknown_tool
            (404), tool_registry_unavailable (503: the host wired no registry; nothing
            recorded), needs_reconciliation (a dangling write), tool_execution (502;
            the intent stays open).
        GuardRefusal: divergence at ``seq``.
    """
    tool = await _registered_tool(registry, name, tool_input, key)
    found = await at_seq(access, run_id, seq)
    view = found.view
    intent = ToolCallRequested(
        tool=name, input=tool_input, effect=tool.effect.value, idempotency_key=key
    )
    if found.intent is not None:
        done = _recorded_call(found, run_id, seq, (name, tool_input, tool.effect.value, key))
        if done is not None:
            return done
    else:
        _, view = await access.append(run_id, [intent], view)
    output = await _performed(tool, name, tool_input, run_id, seq, key)
    await access.append(run_id, [ToolCallCompleted(seq=seq, output=output)], view)
    return TOOL_STEP_DONE.build(output=output)


async def _registered_tool(registry: ToolRegistry, name: Any, tool_input: Any, key: Any) -> Tool:
    """The registry's tool ``name``, once the call's name, key and input are all it takes.

    Raises:
        OperationRefused: bad_request, tool_registry_unavailable or unknown_tool, as
            ``tool_step`` says; nothing recorded.
    """
    if not isinstance(name, str) or not name:
        raise bad_request("`tool` must be a tool name")
    if key is not None and (not isinstance(key, str) or not key):
        raise bad_request("`idempotency_key` must be a non-empty string or null")
    if not registry.wired:
        raise registry_unavailable(f"perform the tool {name!r}")
    tool = registry.get(name)
    if tool is None:
        # The registry's own tools: a file tool is an agent's, never a client run's step.
        known = ", ".join(n for n in registry.names() if registry.get(n) is not None) or "none"
        raise OperationRefused(
            ErrorCode.UNKNOWN_TOOL, f"this daemon has no tool {name!r} (it has: {known})"
        )
    try:
        what = f"the input of tool {name}"
        await off_loop(partial(validate, tool.input_schema, tool_input, what=what))
    except SchemaViolation as exc:
        raise bad_request(exc.message, details={"violations": exc.violations}) from None
    return tool


def _recorded_call(found: _AtSeq, run_id: str, seq: int, call: tuple) -> dict | None:
    """A retry of the call whose intent the log holds at ``seq``: its answer when it completed,
    None when it is open and safe to perform again.

    ``call``: the tool, input, effect and key the retry gives, all of which must match.

    Raises:
        GuardRefusal: ``seq`` holds another call.
        OperationRefused: needs_reconciliation, the open intent is a write's (or one
            ``_dangling`` refuses).
    """
    recorded = found.intent.event
    if (
        recorded.KIND is not EventKind.TOOL_CALL_REQUESTED
        or (
            recorded.tool,
            recorded.input,
            recorded.effect,
            recorded.idempotency_key,
        )
        != call
    ):
        raise GuardRefusal(
            f"seq {seq} of run {run_id} holds a {recorded.KIND.value} that is not this call "
            f"(tool, input, effect and key must all match for a retry)"
        )
    if found.completion is not None:
        return TOOL_STEP_DONE.build(output=found.completion.event.output)
    _dangling(found, run_id, seq)
    if recorded.effect == "write":
        raise needs_reconciliation(run_id, found.view)
    return None


async def _performed(
    tool: Tool, name: str, tool_input: Any, run_id: str, seq: int, key: Any
) -> Any:
    """The output of one performance of ``tool`` for the intent at ``seq``.

    Raises:
        OperationRefused: tool_execution (502) when every attempt failed; the intent stays
            open.
    """
    try:
        outcome, attempt = await dispatch(tool, tool_input, run_id=run_id, seq=seq, key=key)
    except DispatchFailed as failed:
        raise OperationRefused(
            ErrorCode.TOOL_EXECUTION,
            f"tool {name} at seq {seq} failed after {failed.attempts} attempt(s): "
            f"{failed.message}; its intent stays open"
            + (
                ""
                if tool.effect.value != "write"
                else ", and as a write it now needs reconciliation"
            ),
        ) from None
    return await off_loop(outcome_output, tool, outcome, attempt, shielded=True)
