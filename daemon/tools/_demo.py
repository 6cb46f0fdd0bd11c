"""Deterministic demo tools, one per effect class, plus a gate and a timer.

``lookup_invoice`` (read), ``issue_refund`` (write) and ``send_email``
(idempotent) record every real execution in a side-effect ledger: a JSON-lines
file (fsynced before the tool returns), so a test can count what happened in
the world across killed processes. ``SALVOR_DEMO_EFFECTS`` names it (set but
empty: no ledger); unset, a SQLite store's demo tools share one beside the
store file, so a `salvor run` and a daemon over the same store see one world.
``issue_refund`` is keyed on its invoice (two runs refunding one invoice
refund it once) and probed by ``lookup_refund``, a read of the refunds the
ledger holds: found, the refund landed (with the refund it recorded); sent
to the bank with no answer recorded (a process killed in that gap, the
``issue_refund:sent`` fault point), or no ledger at all, it cannot tell;
nothing, it did not land.
``send_email`` behaves like a provider that collapses duplicate idempotency
keys: a repeat key is recorded as not delivered; ``publish_post`` is a write
with no key at all (the graph examples publish with it, and a fork that would
publish again is refused until someone acknowledges it). ``request_approval`` suspends
the run on a human gate (or a signal), ``wait_until`` puts it to sleep. ``read_document`` reads a
file (its one declared file input, ``path``): only the daemon's temporary copy of a file a flow
sent, never a path a caller chose.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trio
from salvor.protocol import Effect, parse_instant
from salvor.store import sqlite_path

from ..processes import kill_if_requested
from ._file_inputs import handed_copy
from ._registry import Probe, SleepUntil, Suspend, Tool, ToolCall, ToolFailed, ToolRegistry

EFFECTS_ENV = "SALVOR_DEMO_EFFECTS"
# The ledger's name beside a SQLite store file, when ``EFFECTS_ENV`` is unset.
BESIDE_STORE = ".demo-effects.jsonl"


def effects_location(store_url: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Where the demo tools' ledger is: ``EFFECTS_ENV``, else beside a SQLite store, or nowhere."""
    if EFFECTS_ENV in environ:
        return environ[EFFECTS_ENV] or None
    database = sqlite_path(store_url) if store_url is not None else None
    return None if database is None else str(database.with_name(database.name + BESIDE_STORE))


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


class EffectLedger:
    """The world the demo tools act on: an append-only JSON-lines file, or nothing."""

    def __init__(self, path: str | None) -> None:
        self._path = Path(path) if path else None
        self._lock = trio.Lock()

    def _append_sync(self, record: dict) -> None:
        # Its user's alone from creation, as the store beside it (the refunds it records).
        with open(self._path, "a", encoding="utf-8", opener=_private) as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _records_sync(self, tool: str) -> list[dict]:
        try:
            lines = self._path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        return [r for r in map(json.loads, filter(None, lines)) if r["tool"] == tool]

    @property
    def configured(self) -> bool:
        return self._path is not None

    async def record(self, record: dict) -> None:
        if self._path is not None:
            async with self._lock:
                await trio.to_thread.run_sync(self._append_sync, record)

    async def records(self, tool: str) -> list[dict]:
        """What ``tool`` recorded, oldest first (nothing when no ledger is configured)."""
        if self._path is None:
            return []
        async with self._lock:
            return await trio.to_thread.run_sync(self._records_sync, tool)

    async def delivered_keys(self, tool: str) -> set[str]:
        return {r["idempotency_key"] for r in await self.records(tool) if r.get("delivered")}


class _DemoWorld:
    """The demo tools' handlers, acting on one ledger."""

    def __init__(self, ledger: EffectLedger) -> None:
        self.ledger = ledger

    async def lookup_invoice(self, args: dict, call: ToolCall) -> dict:
        invoice_id = args["invoice_id"]
        await self.ledger.record(
            {"tool": "lookup_invoice", "input": args, "run_id": call.run_id, "seq": call.seq}
        )
        kill_if_requested("lookup_invoice")
        return {
            "invoice_id": invoice_id,
            "amount_cents": 1000 + _digest(invoice_id) % 9000,
            "customer_email": f"billing+{invoice_id.lower()}@example.com",
            "status": "paid",
        }

    async def issue_refund(self, args: dict, call: ToolCall) -> dict:
        if args["amount_cents"] <= 0:
            raise ToolFailed("a refund must be for a positive amount", retryable=False)
        # The key (the invoice's identity) names the refund, as a payment
        # provider's idempotency key would: a retry refunds under the same id.
        # Its intent is durable and nothing was sent: a kill here leaves a write that did not
        # land, which a probe finds out (the fault point of the composed-run kill tests).
        kill_if_requested("issue_refund:before")
        key = call.idempotency_key or f"{call.run_id}:{call.seq}"
        refund = {
            "refund_id": "rf_" + hashlib.sha256(key.encode()).hexdigest()[:12],
            "invoice_id": args["invoice_id"],
            "amount_cents": args["amount_cents"],
        }
        # What the bank was sent, then what it answered: a kill between the
        # two leaves a refund whose outcome nobody (its probe included) knows.
        # (Its own tool name, so a count of refunds counts answered ones.)
        await self.ledger.record(
            {
                "tool": "issue_refund:sent",
                "input": args,
                "run_id": call.run_id,
                "seq": call.seq,
                "idempotency_key": call.idempotency_key,
                # Which process sent it, and when: the cluster kill tests tell a paused node's
                # sends from the others'.
                "pid": os.getpid(),
                "at": time.time(),
            }
        )
        kill_if_requested("issue_refund:sent")
        await self.ledger.record(
            {
                "tool": "issue_refund",
                "input": args,
                "run_id": call.run_id,
                "seq": call.seq,
                "idempotency_key": call.idempotency_key,
                "refund": refund,
            }
        )
        kill_if_requested("issue_refund")
        return refund

    async def lookup_refund(self, args: dict, call: ToolCall) -> dict:
        invoice_id = args["invoice_id"]
        kill_if_requested("lookup_refund")
        if not self.ledger.configured:
            return {
                "invoice_id": invoice_id,
                "found": None,
                "note": "no effect ledger is configured, so no refund can be looked up",
            }
        refunds = [
            r["refund"]
            for r in await self.ledger.records("issue_refund")
            if r["input"]["invoice_id"] == invoice_id
        ]
        if refunds:
            return {"invoice_id": invoice_id, "found": True, "refund": refunds[-1]}
        sent = await self.ledger.records("issue_refund:sent")
        if any(r["input"]["invoice_id"] == invoice_id for r in sent):
            return {
                "invoice_id": invoice_id,
                "found": None,
                "note": "the bank was sent this refund and its answer was never recorded",
            }
        return {"invoice_id": invoice_id, "found": False}

    async def send_email(self, args: dict, call: ToolCall) -> dict:
        key = call.idempotency_key
        delivered = key not in await self.ledger.delivered_keys("send_email")
        await self.ledger.record(
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

    async def read_document(self, args: dict, call: ToolCall) -> dict:
        opened = args["path"]
        if not await trio.to_thread.run_sync(handed_copy, opened):
            # A caller's path would read whatever file the daemon can: only the daemon's copy
            # of a flow's tool file is read.
            raise ToolFailed(
                f"read_document reads only a file a flow sent with its call; {opened!r} is not one",
                retryable=False,
            )
        try:
            data = await trio.Path(opened).read_bytes()
        except OSError as exc:
            raise ToolFailed(f"cannot read the document: {exc.strerror or exc}") from None
        # Where it was read from, so a test can tell the daemon's copy from the client's file.
        await self.ledger.record(
            {"tool": "read_document", "opened": opened, "run_id": call.run_id, "seq": call.seq}
        )
        kill_if_requested("read_document")
        answer: dict = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        if opened.lower().endswith(".json"):
            try:
                answer["json"] = json.loads(data)
            except ValueError:
                raise ToolFailed("the document is not JSON", retryable=False) from None
        elif opened.lower().endswith((".txt", ".yaml")):
            answer["text"] = data.decode("utf-8", errors="replace")
        return answer

    async def request_approval(self, args: dict, call: ToolCall) -> Suspend:
        return Suspend(
            reason=args.get("reason") or "a person must approve before the run goes on",
            input_schema={
                "type": "object",
                "required": ["approved"],
                "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
            },
            kind="signal" if args.get("signal") else None,
        )

    async def wait_until(self, args: dict, call: ToolCall) -> SleepUntil:
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

    async def publish_post(self, args: dict, call: ToolCall) -> dict:
        # No key: the post is named by the call that made it, so every execution is a new post.
        post_id = "post_" + hashlib.sha256(f"{call.run_id}:{call.seq}".encode()).hexdigest()[:12]
        await self.ledger.record(
            {
                "tool": "publish_post",
                "input": args,
                "run_id": call.run_id,
                "seq": call.seq,
                "post_id": post_id,
            }
        )
        kill_if_requested("publish_post")
        return {"post_id": post_id, "title": args["title"]}


def _refund_tools(world: _DemoWorld) -> list[Tool]:
    """The invoice desk: look an invoice up, refund it (keyed, probed), find the refund."""
    return [
        Tool(
            name="lookup_invoice",
            description="Look up an invoice by id: amount, customer email and status.",
            effect=Effect.READ,
            input_schema={
                "type": "object",
                "required": ["invoice_id"],
                "properties": {"invoice_id": {"type": "string", "minLength": 1}},
            },
            handler=world.lookup_invoice,
        ),
        Tool(
            name="lookup_refund",
            description="Look up the refund of an invoice, if one was issued.",
            effect=Effect.READ,
            input_schema={
                "type": "object",
                "required": ["invoice_id"],
                "properties": {"invoice_id": {"type": "string", "minLength": 1}},
            },
            handler=world.lookup_refund,
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
            handler=world.issue_refund,
            idempotency_keys=("invoice_id",),
            probe=Probe(
                tool="lookup_refund",
                input={"invoice_id": "invoice_id"},
                landed="found",
                output="refund",
            ),
        ),
    ]


def _messaging_tools(world: _DemoWorld) -> list[Tool]:
    """What reaches people: an email (duplicates collapse) and a post (they do not)."""
    return [
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
            handler=world.send_email,
        ),
        Tool(
            name="publish_post",
            description="Publish a post. A write with no key: publishing twice posts twice.",
            effect=Effect.WRITE,
            input_schema={
                "type": "object",
                "required": ["title", "body"],
                "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
            },
            handler=world.publish_post,
        ),
    ]


def _file_tools(world: _DemoWorld) -> list[Tool]:
    """What reads a file: in a flow, a file of the client's, handed over by the daemon."""
    return [
        Tool(
            name="read_document",
            description=(
                "Read a document (.json parsed, .txt or .yaml as text, .png by digest): its "
                "SHA-256, size and content."
            ),
            effect=Effect.READ,
            input_schema={
                "type": "object",
                "required": ["path"],
                "properties": {"path": {"type": "string", "minLength": 1}},
            },
            handler=world.read_document,
            file_inputs=("path",),
        ),
    ]


def _waiting_tools(world: _DemoWorld) -> list[Tool]:
    """What makes a run wait: a gate for a person (or a signal) and a timer."""
    return [
        Tool(
            name="request_approval",
            description=(
                "Pause the run until a person (or, with signal=true, an external system) approves."
            ),
            effect=Effect.READ,
            input_schema={
                "type": "object",
                "properties": {"reason": {"type": "string"}, "signal": {"type": "boolean"}},
            },
            handler=world.request_approval,
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
            handler=world.wait_until,
        ),
    ]


def demo_registry(effects_path: str | None = None, *, store_url: str | None = None) -> ToolRegistry:
    """The demo tools, acting on the ledger at ``effects_path`` (else ``effects_location``)."""
    ledger = EffectLedger(effects_path if effects_path is not None else effects_location(store_url))
    world = _DemoWorld(ledger)
    return ToolRegistry(
        [
            *_refund_tools(world),
            *_messaging_tools(world),
            *_file_tools(world),
            *_waiting_tools(world),
        ]
    )
