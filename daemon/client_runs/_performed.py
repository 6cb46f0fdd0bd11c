"""Calls a client performs itself, with its own secrets: recorded
write-ahead, completed on its report.

The daemon never sees these calls happen. It records the intent before the
client acts (``performed_by: "client"``), derives a client tool's
idempotency key itself (the party performing a write must not also choose
its key), deduplicates a declared key, and checks a reported result against
the operator's declaration before the report becomes history. Every refusal
records nothing.
"""

from __future__ import annotations

import re
from typing import Any

from salvor.protocol import (
    Actor,
    ErrorCode,
    EventKind,
    GuardRefusal,
    ModelCallCompleted,
    ModelCallRequested,
    PendingKind,
    RunView,
    ToolCallCompleted,
    ToolCallRequested,
    encode_payload,
)
from salvor.store import ClaimHeld

from ..recording import StoreAccess, claim_to_settle, tool_error
from ..web import OperationRefused, bad_request
from ._answers import CLIENT_MODEL_OPENED, CLIENT_TOOL_OPENED, COMPLETED
from ._client_tools import ClientTool
from ._steps import at_seq

_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
ERROR_KINDS = ("invalid_input", "handler", "output_serialization")


def completion_refused(message: str) -> OperationRefused:
    return OperationRefused(ErrorCode.CLIENT_COMPLETION_REFUSED, message)


def declared(tools: dict[str, ClientTool], name: Any) -> ClientTool:
    if not isinstance(name, str) or not name:
        raise bad_request("`tool` must be a tool name")
    tool = tools.get(name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        raise OperationRefused(
            ErrorCode.UNKNOWN_TOOL,
            f"no client tool {name!r} is declared on this daemon (declared: {known}); "
            "an operator declares one with `salvor serve --client-tool FILE`",
        )
    return tool


async def tool_intent(
    access: StoreAccess, tool: ClientTool, run_id: str, seq: int, tool_input: Any
) -> dict:
    """Open (or find again) the client-performed call at ``seq``; what the client must do next."""
    tool.check_input(tool_input)
    key = tool.key(run_id, seq, tool_input)
    found = await at_seq(access, run_id, seq)
    intent = ToolCallRequested(
        tool=tool.name,
        input=tool_input,
        effect=tool.effect.value,
        idempotency_key=key,
        performed_by=Actor.CLIENT,
    )
    answer = CLIENT_TOOL_OPENED.build(
        seq=seq, idempotency_key=key, effect=tool.effect.value, settled=False
    )
    if found.intent is not None:
        recorded = found.intent.event
        if recorded.KIND is not EventKind.TOOL_CALL_REQUESTED or encode_payload(
            recorded, seq=seq
        ) != encode_payload(intent, seq=seq):
            raise GuardRefusal(
                f"seq {seq} of run {run_id} already holds a {recorded.KIND.value} that is not this "
                "call; a retry must post the same tool and input to the same position"
            )
        if found.completion is not None:
            return CLIENT_TOOL_OPENED.check(
                {**answer, "settled": True, "output": found.completion.event.output}
            )
        return answer
    if not tool.deduplicates:
        await access.append(run_id, [intent], found.view)
        return answer
    claim = await access.read(access.store.claims.get_claim, key)
    if claim is not None and claim.state == "settled":
        # The same call (by its declared key) already landed: copy its
        # completion here; the client performs nothing.
        copied = ToolCallCompleted(
            seq=seq,
            output=claim.output,
            deduplicated_from={"run_id": claim.run_id, "seq": claim.seq},
        )
        await access.append(run_id, [intent, copied], found.view)
        return CLIENT_TOOL_OPENED.check({**answer, "settled": True, "output": claim.output})
    if claim is not None:
        raise GuardRefusal(
            f"the key of this {tool.name} call is held by the unfinished call at seq {claim.seq}; "
            "open it again once that one is settled"
        )
    try:
        await access.append(run_id, [intent], found.view, claim=key)
    except ClaimHeld as exc:
        raise GuardRefusal(
            f"the key of this {tool.name} call was just claimed by another call: {exc.message}"
        ) from None
    return answer


async def tool_completion(
    access: StoreAccess, tools: dict[str, ClientTool], run_id: str, seq: int, body: dict
) -> dict:
    """Record what the client says its call at ``seq`` returned (``output``)
    or how it failed (``error``).

    The call's claim (a declared key) is settled by an ``output`` and
    released by an ``error``, in the completion's own append; a refused
    report records nothing and leaves the claim as it was.
    """
    if ("output" in body) == ("error" in body):
        raise bad_request(
            "give exactly one of `output` (what the call returned) and `error` (how it failed)"
        )
    view, intent = await _client_intent(access, run_id, seq)
    tool = _completing_tool(tools, intent.tool, run_id)
    output = _reported_output(tool, intent.input, body)
    held = await claim_to_settle(access, run_id, seq, intent.idempotency_key)
    # A reported failure leaves no outcome to copy: its claim is released, so a later call
    # of the same key is performed afresh instead of inheriting the failure.
    failed = "error" in body
    await access.append(
        run_id,
        [ToolCallCompleted(seq=seq, output=output)],
        view,
        settle=None if failed else held,
        release=held if failed else None,
    )
    return COMPLETED.build(seq=seq, completed=True)


async def _client_intent(
    access: StoreAccess, run_id: str, seq: int
) -> tuple[RunView, ToolCallRequested]:
    """The run's view, and the intent of a client-performed tool call its log ends at, at
    ``seq``.

    Raises:
        GuardRefusal: the log does not end at a tool intent at ``seq``.
        OperationRefused: completion_refused, salvor performed that call.
    """
    view = await access.read(access.store.read_view, run_id)
    pending = view.pending if view is not None else None
    if pending is None or pending.kind != PendingKind.TOOL or pending.seq != seq:
        raise GuardRefusal(
            f"run {run_id}'s log does not end at a tool intent at seq {seq}; "
            "there is nothing to complete"
        )
    intent = (await access.read(access.store.read_log, run_id, seq))[0].event
    if intent.performed_by != Actor.CLIENT:
        raise completion_refused(
            f"the call at seq {seq} was performed by salvor, which holds its real result; "
            f"a client cannot complete it"
        )
    return view, intent


def _completing_tool(tools: dict[str, ClientTool], name: str, run_id: str) -> ClientTool:
    """The declaration of client tool ``name``, when it lets its client report completions."""
    tool = tools.get(name)
    if tool is None:
        raise bad_request(
            f"client tool {name!r} is no longer declared here; declare it with --client-tool"
        )
    if not tool.trust_completion:
        raise completion_refused(
            f"client tool {tool.name} is declared trust_completion = false: a person resolves its "
            f"calls (POST /v1/runs/{run_id}/resolve), not the client that made them"
        )
    return tool


def _reported_output(tool: ClientTool, tool_input: Any, body: dict) -> Any:
    """The output the log records for the client's report: its ``output``, checked against the
    declaration, or its ``error`` as a tool error."""
    if "output" in body:
        if tool.output_schema is None:
            raise completion_refused(
                f"client tool {tool.name} declares no output_schema, so a reported output "
                f"could not be checked and is not recorded"
            )
        tool.check_output(body["output"], tool_input)
        return body["output"]
    error = body["error"]
    if (
        not isinstance(error, dict)
        or set(error) - {"message", "kind"}
        or not isinstance(error.get("message"), str)
    ):
        raise bad_request(
            "`error` must be {message: string, kind?: invalid_input|handler|output_serialization}"
        )
    kind = error.get("kind", "handler")
    if kind not in ERROR_KINDS:
        raise bad_request(f"`error.kind` must be one of {', '.join(ERROR_KINDS)}")
    return tool_error(kind, error["message"], 1)


async def model_intent(
    access: StoreAccess,
    run_id: str,
    seq: int,
    request_hash: Any,
    request_body: Any,
    *,
    record_prompts: bool,
) -> dict:
    """Open (or find again) the client-performed model call at ``seq``."""
    if not isinstance(request_hash, str) or not _HASH.match(request_hash):
        raise bad_request(
            "`request_hash` must be sha256:<64 lower-case hex digits> of the canonical request"
        )
    found = await at_seq(access, run_id, seq)
    if found.intent is not None:
        recorded = found.intent.event
        if (
            recorded.KIND is not EventKind.MODEL_CALL_REQUESTED
            or recorded.request_hash != request_hash
        ):
            raise GuardRefusal(
                f"seq {seq} of run {run_id} holds a {recorded.KIND.value} that is not this request"
            )
        if recorded.performed_by != Actor.CLIENT:
            raise GuardRefusal(
                f"the model call at seq {seq} was performed by salvor; the client's cursor and the "
                f"log disagree about who owns it"
            )
        if found.completion is not None:
            done = found.completion.event
            return CLIENT_MODEL_OPENED.build(
                seq=seq, settled=True, response=done.response, usage=done.usage
            )
        return CLIENT_MODEL_OPENED.build(seq=seq, settled=False)
    intent = ModelCallRequested(
        request_hash=request_hash,
        request_body=request_body if record_prompts else None,
        performed_by=Actor.CLIENT,
    )
    await access.append(run_id, [intent], found.view)
    return CLIENT_MODEL_OPENED.build(seq=seq, settled=False)


async def model_completion(
    access: StoreAccess, run_id: str, seq: int, response: Any, usage: Any
) -> dict:
    """Record what the client says its model call at ``seq`` returned."""
    view = await access.read(access.store.read_view, run_id)
    pending = view.pending if view is not None else None
    if pending is None or pending.kind != PendingKind.MODEL or pending.seq != seq:
        raise GuardRefusal(
            f"run {run_id}'s log does not end at a model intent at seq {seq}; "
            "there is nothing to complete"
        )
    intent = (await access.read(access.store.read_log, run_id, seq))[0].event
    if intent.performed_by != Actor.CLIENT:
        raise completion_refused(
            f"the model call at seq {seq} was performed by salvor, which holds its real response"
        )
    await access.append(run_id, [ModelCallCompleted(seq=seq, response=response, usage=usage)], view)
    return COMPLETED.build(seq=seq, completed=True)
