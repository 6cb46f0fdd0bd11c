"""Deterministic demo tools, one per effect class, plus a gate and a timer.

``lookup_invoice`` (read), ``issue_refund`` (write) and ``send_email``
(idempotent) record every real execution in a side-effect ledger: a JSON-lines
file named by ``SALVOR_DEMO_EFFECTS`` (fsynced before the tool returns), so a
test can count what happened in the world across killed processes.
``send_email`` behaves like a provider that collapses duplicate idempotency
keys: a repeat key is recorded as not delivered. ``request_approval`` suspends
the run on a human gate (or a signal), ``wait_until`` puts it to sleep.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trio
from salvor.protocol import Effect, parse_instant

from ..processes import kill_if_requested
from ._registry import SleepUntil, Suspend, Tool, ToolCall, ToolFailed, ToolRegistry

EFFECTS_ENV = "SALVOR_DEMO_EFFECTS"


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


class EffectLedger:
    """The world the demo tools act on: an append-only JSON-lines file, or nothing."""

    def __init__(self, path: str | None) -> None:
        self._path = Path(path) if path else None
        self._lock = trio.Lock()

    def _append_sync(self, record: dict) -> None:
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _keys_sync(self, tool: str) -> set[str]:
        try:
            lines = self._path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return set()
        keys = set()
        for line in lines:
            record = json.loads(line)
            if record["tool"] == tool and record.get("delivered"):
                keys.add(record["idempotency_key"])
        return keys

    async def record(self, record: dict) -> None:
        if self._path is not None:
            async with self._lock:
                await trio.to_thread.run_sync(self._append_sync, record)

    async def delivered_keys(self, tool: str) -> set[str]:
        if self._path is None:
            return set()
        async with self._lock:
            return await trio.to_thread.run_sync(self._keys_sync, tool)


def demo_registry(effects_path: str | None = None) -> ToolRegistry:
    """The demo tools, acting on the ledger at ``effects_path`` (or ``$SALVOR_DEMO_EFFECTS``)."""
    ledger = EffectLedger(effects_path if effects_path is not None else os.environ.get(EFFECTS_ENV))

    async def lookup_invoice(args: dict, call: ToolCall) -> dict:
        invoice_id = args["invoice_id"]
        await ledger.record(
            {"tool": "lookup_invoice", "input": args, "run_id": call.run_id, "seq": call.seq}
        )
        kill_if_requested("lookup_invoice")
        return {
            "invoice_id": invoice_id,
            "amount_cents": 1000 + _digest(invoice_id) % 9000,
            "customer_email": f"billing+{invoice_id.lower()}@example.com",
            "status": "paid",
        }

    async def issue_refund(args: dict, call: ToolCall) -> dict:
        if args["amount_cents"] <= 0:
            raise ToolFailed("a refund must be for a positive amount", retryable=False)
        await ledger.record(
            {"tool": "issue_refund", "input": args, "run_id": call.run_id, "seq": call.seq}
        )
        kill_if_requested("issue_refund")
        refund_id = "rf_" + hashlib.sha256(f"{call.run_id}:{call.seq}".encode()).hexdigest()[:12]
        return {
            "refund_id": refund_id,
            "invoice_id": args["invoice_id"],
            "amount_cents": args["amount_cents"],
        }

    async def send_email(args: dict, call: ToolCall) -> dict:
        key = call.idempotency_key
        delivered = key not in await ledger.delivered_keys("send_email")
        await ledger.record(
            {
                "tool": "send_email",
                "input": args,
                "idempotency_key": key,
                "delivered": delivered,
                "run_id": call.run_id,
                "seq": call.seq,
            }
        )
        kill_if_requested("send_email")
        return {
            "message_id": "msg_" + hashlib.sha256(key.encode()).hexdigest()[:12],
            "to": args["to"],
        }

    async def request_approval(args: dict, call: ToolCall) -> Suspend:
        return Suspend(
            reason=args.get("reason") or "a person must approve before the run goes on",
            input_schema={
                "type": "object",
                "required": ["approved"],
                "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
            },
            kind="signal" if args.get("signal") else None,
        )

    async def wait_until(args: dict, call: ToolCall) -> SleepUntil:
        if "wake_at" in args:
            try:
                return SleepUntil(wake_at=parse_instant(args["wake_at"]))
            except ValueError as exc:
                raise ToolFailed(
                    f"wake_at is not an RFC 3339 instant: {exc}", retryable=False
                ) from None
        if "seconds" in args:
            return SleepUntil(wake_at=datetime.now(UTC) + timedelta(seconds=args["seconds"]))
        raise ToolFailed("give `wake_at` (an RFC 3339 instant) or `seconds`", retryable=False)

    return ToolRegistry(
        [
            Tool(
                name="lookup_invoice",
                description="Look up an invoice by id: amount, customer email and status.",
                effect=Effect.READ,
                input_schema={
                    "type": "object",
                    "required": ["invoice_id"],
                    "properties": {"invoice_id": {"type": "string", "minLength": 1}},
                },
                handler=lookup_invoice,
            ),
            Tool(
                name="issue_refund",
                description="Refund part or all of an invoice to the customer's card. Moves money.",
                effect=Effect.WRITE,
                input_schema={
                    "type": "object",
                    "required": ["invoice_id", "amount_cents"],
                    "properties": {
                        "invoice_id": {"type": "string", "minLength": 1},
                        "amount_cents": {"type": "integer"},
                    },
                },
                handler=issue_refund,
            ),
            Tool(
                name="send_email",
                description=(
                    "Email the customer. Duplicate deliveries under one idempotency key collapse."
                ),
                effect=Effect.IDEMPOTENT,
                input_schema={
                    "type": "object",
                    "required": ["to", "subject", "body"],
                    "properties": {
                        "to": {"type": "string"},
                        "subject": {"type": "string"},
                        "body": {"type": "string"},
                    },
                },
                handler=send_email,
            ),
            Tool(
                name="request_approval",
                description=(
                    "Pause the run until a person (or, with "
                    "signal=true, an external system) approves."
                ),
                effect=Effect.READ,
                input_schema={
                    "type": "object",
                    "properties": {"reason": {"type": "string"}, "signal": {"type": "boolean"}},
                },
                handler=request_approval,
            ),
            Tool(
                name="wait_until",
                description=(
                    "Sleep durably until an RFC 3339 instant (wake_at) or for a number of seconds."
                ),
                effect=Effect.READ,
                input_schema={
                    "type": "object",
                    "properties": {
                        "wake_at": {"type": "string"},
                        "seconds": {"type": "number", "minimum": 0},
                    },
                },
                handler=wait_until,
            ),
        ]
    )
