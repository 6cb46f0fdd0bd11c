"""Readable renderings: one line per recorded event, for `salvor log` and live progress, one
block per run of the reconciliation queue, for `salvor reconcile`, and the sentence that says
where a run rests and what continues it."""

from __future__ import annotations

import json
from typing import Any

from salvor.protocol import TOOL_ERROR_KEY, Actor, Envelope, EventKind, RunState, RunView

from ._hints import resume_hint, wake_hint

_MAX = 96


def _short(value: Any) -> str:
    text = (
        value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    )
    return text if len(text) <= _MAX else text[: _MAX - 1] + "…"


def describe(envelope: Envelope) -> str:
    """``seq  time  Kind  detail  [Client]/[Operator]``."""
    event = envelope.event
    kind = event.KIND
    payload = event.to_payload()
    if kind is EventKind.RUN_STARTED:
        detail = f"agent {payload['agent_def_hash'][:19]}… input {_short(payload['input'])}"
        if payload.get("labels"):
            detail += f" labels {_short(payload['labels'])}"
    elif kind is EventKind.MODEL_CALL_REQUESTED:
        detail = payload["request_hash"][:19] + "…"
    elif kind is EventKind.MODEL_CALL_COMPLETED:
        blocks = (
            payload["response"].get("content", []) if isinstance(payload["response"], dict) else []
        )
        said = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        calls = [b.get("name") for b in blocks if b.get("type") == "tool_use"]
        usage = payload["usage"]
        detail = (
            f"for seq {payload['seq']}: "
            + (f"calls {', '.join(calls)}" if calls else _short(" ".join(said)))
            + f" ({usage['input_tokens']} in / {usage['output_tokens']} out)"
        )
    elif kind is EventKind.TOOL_CALL_REQUESTED:
        detail = f"{payload['tool']} ({payload['effect']}) {_short(payload['input'])}"
        if payload["idempotency_key"]:
            detail += f" key {payload['idempotency_key']}"
    elif kind is EventKind.TOOL_CALL_COMPLETED:
        output = payload["output"]
        if isinstance(output, dict) and TOOL_ERROR_KEY in output:
            detail = f"for seq {payload['seq']}: error: {output[TOOL_ERROR_KEY]['message']}"
        else:
            detail = f"for seq {payload['seq']}: {_short(output)}"
        if payload.get("deduplicated_from"):
            detail += f" (copied from {payload['deduplicated_from']})"
    elif kind is EventKind.SLEEP_COMPLETED:
        detail = ""
    elif kind is EventKind.TOOLS_ATTACHED:
        detail = f"{', '.join(payload['tools'])} by the {payload['by']}"
    else:
        detail = _short(payload)
    tags = ""
    if payload.get("performed_by") == Actor.CLIENT:
        tags += " [Client]"
    if payload.get("settled_by") == Actor.OPERATOR:
        tags += " [Operator]"
    elif payload.get("settled_by") == Actor.PROBE:
        tags += f" [Probe {payload['probe']['tool']}]"
    if payload.get("baseline"):
        tags += " [Baseline]"  # answered from a pinned node's baseline: nothing went out
    return f"{envelope.seq:>5}  {envelope.recorded_at}  {kind.value:<19} {detail}{tags}".rstrip()


def describe_reconciliation(item: dict) -> str:
    """A ``GET /v1/reconciliations`` item as a block a person reads: which run and write, since
    when, and the two ways to settle it."""
    run, intent, resolve = item["run"], item["intent"], item["resolve"]
    who = resolve["performed_by"]
    labels = " ".join(f"{k}={v}" for k, v in sorted(item["labels"].items()))
    lines = [
        f"run {run}" + (f"  ({labels})" if labels else ""),
        f"  agent   {item['agent'] or 'unknown'}",
        f"  since   {item['parked_since']}",
        f"  write   {intent['tool']} at seq {intent['seq']} (performed by {who})",
        f"  input   {_short(intent['input'])}",
        f"  key     {item['idempotency_key'] or 'none'}",
    ]
    probe = item["probe"]
    if probe is not None:
        said = (
            f"answered {_short(probe['answer'])}"
            if probe["error"] is None
            else f"failed: {probe['error']}"
        )
        lines.append(
            f"  probe   {probe['tool']} {said} at {probe['observed_at']} "
            f"({'could not tell' if probe['verdict'] == 'unknown' else probe['verdict']})"
        )
    expects = "what it returned"
    if resolve["output_schema"] is not None:
        expects += f", matching {_short(resolve['output_schema'])}"
    if resolve["require_equal"]:
        expects += ", holding " + ", ".join(
            f"{name}={json.dumps(value)}" for name, value in resolve["require_equal"].items()
        )
    lines += [
        f"  landed? `salvor reconcile {run} --output JSON` ({expects})",
        f"  not?    `salvor reconcile {run} --not-landed` (a call that asks again performs it)",
    ]
    return "\n".join(lines)


# The resting states a sentence names the next step for.
PARKED = (RunState.SUSPENDED, RunState.SLEEPING, RunState.BUDGET_EXCEEDED)


def resting_sentence(run_id: str, view: RunView, daemon: str | None) -> str:
    """Where the run rests, and for a parked run the step that continues it from here (through
    ``daemon``, the address of the daemon serving its store, when one does)."""
    d, s = view.detail, view.state
    if s is RunState.COMPLETED:
        return f"run {run_id} completed: {json.dumps(d['output'], ensure_ascii=False)}"
    if s is RunState.FAILED:
        return f"run {run_id} failed: {d['error']}"
    if s is RunState.ABANDONED:
        return f"run {run_id} abandoned" + (f": {d['reason']}" if d.get("reason") else "")
    if s is RunState.SUSPENDED:
        who = "an external signal" if d.get("kind") == "signal" else "a person"
        return (
            f"run {run_id} suspended, waiting on {who}: {d['reason']}; resume it with "
            f"{resume_hint(run_id, daemon, 'JSON')}, the JSON matching "
            f"{json.dumps(d['input_schema'])}"
        )
    if s is RunState.SLEEPING:
        return f"run {run_id} sleeping until {d['wake_at']}; {wake_hint(run_id, daemon)}"
    if s is RunState.BUDGET_EXCEEDED:
        b = d["budget"]
        extend = resume_hint(run_id, daemon, '{"extend_by": N}')
        return (
            f"run {run_id} stopped at its {b['kind']} budget ({d['observed']} of "
            f"{b['limit']}); extend it with {extend}"
        )
    if s is RunState.NEEDS_RECONCILIATION:
        p = view.pending
        return (
            f"run {run_id} needs reconciliation: the write {p.tool} (seq {p.seq}) may or may "
            f"not have happened; check, then `salvor resolve {run_id} --output JSON`"
        )
    return f"run {run_id} is {s.value}"
