"""A client written from the control-plane spec alone, against the real daemon.

Nothing here comes from ``salvor.protocol``: every event payload is the dict
literal the spec writes (``SleepStarted { wake_at }``, ``{"reason": ...,
"input_schema": ..., "kind": "signal"}``, ...), every answer is read where the
spec puts its fields, and the event stream is parsed by hand from its text.
If the daemon's wire shapes drift from the spec, this client is the one that
breaks, as a real SDK would.

The daemon is ``serve`` itself on a loopback port over real SQLite and
PostgreSQL; the model is the scripted provider (the daemon's default executor
is aimed at it), the tools are real tools in this process. (The old-shape
log test alone uses ``salvor.protocol``, to seed a crashed run the way the
daemon's own store writes one.)
"""

from __future__ import annotations

import hashlib
import json

import httpx
import sqlalchemy
import trio
from salvor.protocol import Effect, ModelCallRequested
from salvor.store import normalize_store_url

# The tool registry and the declaration loader as the sibling suites import them:
# this file names no daemon module path, so moving daemon modules leaves it alone.
from tests.daemon.client_runs.test_performed import load_declarations
from tests.daemon.client_runs.test_steps import Tool, ToolFailed, ToolRegistry
from tests.support.api import get_run, raw_sql, register, rested, seed_run
from tests.support.scripted_provider import text_reply

AGENT = "sha256:" + "5e" * 32
REQUEST = {
    "model": "scripted-model",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hello"}],
}
SIGNAL_SCHEMA = {
    "type": "object",
    "required": ["paid"],
    "properties": {"paid": {"type": "boolean"}},
}
PAST_WAKE = "2026-01-01T00:00:00Z"
INTENTS = {"ModelCallRequested": "ModelCallCompleted", "ToolCallRequested": "ToolCallCompleted"}
WAIT = 30


def envelope(run_id: str, seq: int, kind: str, payload: dict) -> dict:
    # The spec: `recorded_at` is required on the wire and its value ignored.
    return {
        "run_id": run_id,
        "seq": seq,
        "schema_version": 1,
        "recorded_at": "1970-01-01T00:00:00Z",
        "event": {"kind": kind, "payload": payload},
    }


def canonical_hash(value) -> str:
    # The spec: any canonical-JSON SHA-256 reproduces a derived key (ASCII keys, plain values).
    return (
        "sha256:"
        + hashlib.sha256(
            json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
    )


def registry(calls: list[str]) -> ToolRegistry:
    async def lookup(args, call):
        calls.append("lookup")
        return {"amount": 42}

    async def charge(args, call):
        calls.append("charge")
        raise ToolFailed("the card network hung up")

    schema = {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}
    return ToolRegistry(
        [
            Tool(
                name="lookup",
                description="read",
                effect=Effect.READ,
                input_schema=schema,
                handler=lookup,
            ),
            Tool(
                name="charge",
                description="write",
                effect=Effect.WRITE,
                input_schema=schema,
                handler=charge,
            ),
        ]
    )


class SpecClient:
    """The client side of ``/v1/client-runs``, as the spec describes it."""

    def __init__(self, http: httpx.AsyncClient, run_id: str = "") -> None:
        self.http = http
        self.run_id = run_id
        self.token = ""
        self.next_seq = 0

    async def open(self) -> None:
        response = await self.http.post("/v1/client-runs", json={"record_prompts": False})
        assert response.status_code == 201, response.text
        body = response.json()
        assert set(body) == {"run", "drive_token", "log"} and body["log"] == []
        self.run_id, self.token = body["run"], body["drive_token"]

    async def post(self, path: str, body: dict) -> httpx.Response:
        return await self.http.post(
            f"/v1/client-runs/{self.run_id}/{path}",
            json=body,
            headers={"X-Drive-Token": self.token},
        )

    async def append(self, *events: tuple[str, dict]) -> None:
        batch = [
            envelope(self.run_id, self.next_seq + i, kind, payload)
            for i, (kind, payload) in enumerate(events)
        ]
        response = await self.post("events", {"events": batch})
        assert response.status_code == 200, response.text
        assert response.json() == {
            "appended": list(range(self.next_seq, self.next_seq + len(events)))
        }
        self.next_seq += len(events)

    async def step(self, path: str, body: dict, *, events: int = 2) -> dict:
        response = await self.post(path, {"seq": self.next_seq, **body})
        assert response.status_code == 200, response.text
        self.next_seq += events
        return response.json()

    async def run(self) -> dict:
        response = await self.http.get(f"/v1/runs/{self.run_id}")
        assert response.status_code == 200, response.text
        body = response.json()
        assert (
            {
                "run",
                "status",
                "event_count",
                "usage",
                "pending",
                "first_recorded_at",
                "last_recorded_at",
            }
            <= set(body)
            <= {
                "run",
                "status",
                "event_count",
                "usage",
                "pending",
                "first_recorded_at",
                "last_recorded_at",
                "driver",
                # The additive facts GET /v1/runs gives each entry, under the same absence
                # rules, and the head's own driven_by ("client"): a client holding one run's id
                # needs no listing to read them.
                "agent_def_hash",
                "graph_hash",
                "labels",
                "driven_by",
            }
        )
        assert body["run"] == self.run_id and body["event_count"] == self.next_seq
        return body

    async def log(self) -> list[dict]:
        response = await self.http.get(f"/v1/client-runs/{self.run_id}/log")
        assert response.status_code == 200, response.text
        assert set(response.json()) == {"log"}
        return response.json()["log"]

    async def stream(self) -> list[tuple[dict, str]]:
        """Every frame of ``GET /v1/runs/{id}/events`` until the server
        closes it: (fields, raw block)."""
        frames = []
        with trio.fail_after(WAIT):
            async with self.http.stream("GET", f"/v1/runs/{self.run_id}/events") as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                text = "".join([chunk async for chunk in response.aiter_text()])
        for block in text.split("\n\n"):
            fields: dict[str, str] = {}
            for line in block.split("\n"):
                if line and not line.startswith(":"):
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
            if fields:
                frames.append((fields, block))
        return frames


def check_envelopes(log: list[dict], run_id: str) -> None:
    """Every envelope where the spec puts its fields; every intent names its own seq,
    every completion its intent's."""
    for seq, entry in enumerate(log):
        assert list(entry) == ["run_id", "seq", "schema_version", "recorded_at", "event"]
        assert entry["run_id"] == run_id and entry["seq"] == seq and entry["schema_version"] == 1
        assert entry["recorded_at"] != "1970-01-01T00:00:00Z"  # server-stamped
        assert set(entry["event"]) == {"kind", "payload"}
        kind, payload = entry["event"]["kind"], entry["event"]["payload"]
        if kind in INTENTS:
            assert payload["seq"] == seq, entry
        if kind in INTENTS.values():
            intent = log[payload["seq"]]["event"]
            assert INTENTS[intent["kind"]] == kind and intent["payload"]["seq"] == payload["seq"], (
                entry
            )


async def test_a_spec_written_client_drives_reads_and_streams_a_run(
    server_factory, providers, monkeypatch, tmp_path
) -> None:
    provider = providers([text_reply("the plan")])
    monkeypatch.setenv("SALVOR_MODEL_BASE_URL", provider.base_url)
    calls: list[str] = []
    notify = tmp_path / "notify.toml"
    notify.write_text(
        'name = "notify"\neffect = "idempotent"\ntrust_completion = true\n'
        '[input_schema]\ntype = "object"\n'
    )
    server = await server_factory(
        registry=registry(calls), client_tools=load_declarations([str(notify)])
    )
    client = SpecClient(server.client)
    await client.open()
    await client.append(
        (
            "RunStarted",
            {"agent_def_hash": AGENT, "input": {"order": "o-1"}, "labels": {"build": "42"}},
        ),
        ("NowObserved", {"now": "2026-08-14T09:00:00Z"}),
        ("RandomObserved", {"value": "9f86d081884c7d65"}),
        (
            "Suspended",
            {
                "reason": "waiting for the payment webhook",
                "input_schema": SIGNAL_SCHEMA,
                "kind": "signal",
            },
        ),
    )
    body = await client.run()
    assert body["status"] == {
        "state": "suspended",
        "reason": "waiting for the payment webhook",
        "input_schema": SIGNAL_SCHEMA,
        "kind": "signal",
    }
    assert body["pending"] is None and body["driver"] == "attached"
    assert body["usage"] == {"input_tokens": 0, "output_tokens": 0}
    # A suspended run rests: the stream replays the log, ends with the status, and closes.
    frames = await client.stream()
    assert frames[-1][0]["event"] == "end" and json.loads(frames[-1][0]["data"]) == {
        "status": body["status"]
    }
    assert json.loads(frames[3][0]["data"])["event"]["payload"] == {
        "reason": "waiting for the payment webhook",
        "input_schema": SIGNAL_SCHEMA,
        "kind": "signal",
    }

    await client.append(
        ("Resumed", {"input": {"paid": True}}), ("SleepStarted", {"wake_at": PAST_WAKE})
    )
    status = (await client.run())["status"]
    assert status["state"] == "sleeping" and status["wake_at"] == PAST_WAKE
    assert (
        status["overdue"] is True
        and type(status["overdue_seconds"]) is int
        and status["overdue_seconds"] > 0
    )
    # The run list carries the same status object, overdue included: it is current, not stored.
    (entry,) = [
        e for e in (await server.client.get("/v1/runs")).json()["runs"] if e["run"] == client.run_id
    ]
    assert entry["status"]["state"] == "sleeping" and entry["status"]["wake_at"] == PAST_WAKE
    assert (
        entry["status"]["overdue"] is True
        and entry["status"]["overdue_seconds"] >= status["overdue_seconds"]
    )
    await client.append(("SleepCompleted", {}))

    # A server-performed model step: `{ seq, request }` in, `{ response, usage }` out.
    model_seq = client.next_seq
    answer = await client.step("model-step", {"request": REQUEST})
    assert answer == {
        "response": {
            "model": "scripted-model",
            "content": [{"type": "text", "text": "the plan"}],
            "stop_reason": "end_turn",
        },
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    # A server-performed tool step: the client's `effect` is accepted and ignored.
    tool_seq = client.next_seq
    assert await client.step(
        "tool-step",
        {"tool": "lookup", "input": {"id": "INV-1"}, "idempotency_key": None, "effect": "write"},
    ) == {"output": {"amount": 42}}
    log = await client.log()
    assert log[model_seq]["event"] == {
        "kind": "ModelCallRequested",
        "payload": {
            "seq": model_seq,
            "request_hash": log[model_seq]["event"]["payload"]["request_hash"],
        },
    }
    assert log[model_seq + 1]["event"] == {
        "kind": "ModelCallCompleted",
        "payload": {"seq": model_seq, "response": answer["response"], "usage": answer["usage"]},
    }
    assert log[tool_seq]["event"] == {
        "kind": "ToolCallRequested",
        "payload": {
            "seq": tool_seq,
            "tool": "lookup",
            "input": {"id": "INV-1"},
            "effect": "read",
            "idempotency_key": None,
        },
    }
    assert log[tool_seq + 1]["event"] == {
        "kind": "ToolCallCompleted",
        "payload": {"seq": tool_seq, "output": {"amount": 42}},
    }

    # A model call the client performs: the pending object while it is open.
    request_hash = "sha256:" + hashlib.sha256(b"the client's own request").hexdigest()
    intent_seq = client.next_seq
    assert await client.step("client-model-intent", {"request_hash": request_hash}, events=1) == {
        "seq": intent_seq,
        "settled": False,
    }
    body = await client.run()
    assert body["status"] == {"state": "awaiting_model"}
    assert body["pending"] == {"kind": "model", "seq": intent_seq, "request_hash": request_hash}
    response = await client.post(
        "client-model-completion",
        {
            "seq": intent_seq,
            "response": {"content": []},
            "usage": {"input_tokens": 3, "output_tokens": 2},
        },
    )
    assert response.json() == {"seq": intent_seq, "completed": True}, response.text
    client.next_seq += 1
    assert (await client.log())[intent_seq]["event"]["payload"] == {
        "seq": intent_seq,
        "request_hash": request_hash,
        "performed_by": "client",
    }

    # A tool call the client performs: the key is derived from `{ run, seq, tool }`, a failure
    # is a completion.
    declared = (await server.client.get("/v1/client-tools")).json()
    assert declared == {
        "client_tools": [
            {
                "name": "notify",
                "effect": "idempotent",
                "input_schema": {"type": "object"},
                "trust_completion": True,
            }
        ]
    }
    notify_seq = client.next_seq
    key = canonical_hash({"run": client.run_id, "seq": notify_seq, "tool": "notify"})
    assert await client.step(
        "client-tool-intent", {"tool": "notify", "input": {"to": "ops"}}, events=1
    ) == {"seq": notify_seq, "idempotency_key": key, "effect": "idempotent", "settled": False}
    response = await client.post(
        "client-tool-completion",
        {"seq": notify_seq, "error": {"message": "the mail relay timed out", "kind": "handler"}},
    )
    assert response.json() == {"seq": notify_seq, "completed": True}, response.text
    client.next_seq += 1
    log = await client.log()
    assert log[notify_seq]["event"]["payload"] == {
        "seq": notify_seq,
        "tool": "notify",
        "input": {"to": "ops"},
        "effect": "idempotent",
        "idempotency_key": key,
        "performed_by": "client",
    }
    assert log[notify_seq + 1]["event"]["payload"] == {
        "seq": notify_seq,
        "output": {
            "__salvor_error": {
                "is_error": True,
                "kind": "handler",
                "message": "the mail relay timed out",
                "attempts": 1,
            }
        },
    }

    # A write whose dispatch fails is left open: needs_reconciliation, and the tool pending object.
    write_seq = client.next_seq
    failed = await client.post(
        "tool-step", {"seq": write_seq, "tool": "charge", "input": {"id": "o-1"}}
    )
    assert failed.status_code == 502 and failed.json()["error"]["code"] == "tool_execution"
    client.next_seq += 1
    body = await client.run()
    assert body["status"] == {"state": "needs_reconciliation"}
    pending = {
        "kind": "tool",
        "seq": write_seq,
        "tool": "charge",
        "input": {"id": "o-1"},
        "effect": "write",
        "idempotency_key": None,
    }
    assert body["pending"] == pending
    again = await client.post(
        "tool-step", {"seq": write_seq, "tool": "charge", "input": {"id": "o-1"}}
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "needs_reconciliation"
    intent = again.json()["error"]["details"]["intent"]
    assert intent == {**pending, "recorded_at": intent["recorded_at"]}
    response = await client.post("resolve", {"output": {"charge_id": "ch_by_hand"}})
    assert response.status_code == 200 and response.json() == {
        "run": client.run_id,
        "resolved": True,
    }
    client.next_seq += 1
    assert (await client.log())[-1]["event"]["payload"] == {
        "seq": write_seq,
        "output": {"charge_id": "ch_by_hand"},
        "settled_by": "operator",
    }

    await client.append(
        ("BudgetExceeded", {"budget": {"kind": "tokens", "limit": 10}, "observed": 20})
    )
    assert (await client.run())["status"] == {
        "state": "budget_exceeded",
        "budget": {"kind": "tokens", "limit": 10},
        "observed": 20,
    }
    await client.append(
        ("Resumed", {"input": {"extend_by": 100}}), ("RunCompleted", {"output": {"refunded": True}})
    )

    body = await client.run()
    assert body["status"] == {"state": "completed", "output": {"refunded": True}}
    assert "driver" not in body and body["pending"] is None
    assert body["usage"] == {"input_tokens": 13, "output_tokens": 7}
    replay = (await server.client.get(f"/v1/runs/{client.run_id}/replay")).json()
    assert replay == {
        "status": body["status"],
        "usage": body["usage"],
        "next_seq": client.next_seq,
        "pending": None,
    }
    (entry,) = [
        e for e in (await server.client.get("/v1/runs")).json()["runs"] if e["run"] == client.run_id
    ]
    assert entry["status"] == body["status"] and entry["event_count"] == client.next_seq
    assert entry["step_count"] == 2 and entry["usage"] == body["usage"]
    assert (
        entry["agent_def_hash"] == AGENT
        and entry["labels"] == {"build": "42"}
        and "driver" not in entry
    )

    log = await client.log()
    check_envelopes(log, client.run_id)
    assert [e["event"]["kind"] for e in log] == [
        "RunStarted",
        "NowObserved",
        "RandomObserved",
        "Suspended",
        "Resumed",
        "SleepStarted",
        "SleepCompleted",
        "ModelCallRequested",
        "ModelCallCompleted",
        "ToolCallRequested",
        "ToolCallCompleted",
        "ModelCallRequested",
        "ModelCallCompleted",
        "ToolCallRequested",
        "ToolCallCompleted",
        "ToolCallRequested",
        "ToolCallCompleted",
        "BudgetExceeded",
        "Resumed",
        "RunCompleted",
    ]
    assert log[0]["event"]["payload"] == {
        "agent_def_hash": AGENT,
        "input": {"order": "o-1"},
        "labels": {"build": "42"},
        "driven_by": "client",
    }
    # The stream: one `id: <seq>` / `data: <envelope>` frame per event, no
    # `event:` field, then the end frame.
    frames = await client.stream()
    assert [fields for fields, _ in frames[:-1]] == [
        {"id": str(e["seq"]), "data": json.dumps(e, ensure_ascii=False, separators=(",", ":"))}
        for e in log
    ]
    end, raw = frames[-1]
    assert raw.startswith("event: end\n") and set(end) == {"event", "data"}
    assert json.loads(end["data"]) == {"status": body["status"]}
    assert calls == ["lookup", "charge"] and provider.call_count == 1


async def test_a_spec_written_client_abandons_a_run_parked_at_a_write(server_factory) -> None:
    server = await server_factory(registry=registry([]))
    client = SpecClient(server.client)
    await client.open()
    await client.append(("RunStarted", {"agent_def_hash": AGENT, "input": None}))
    failed = await client.post("tool-step", {"seq": 1, "tool": "charge", "input": {"id": "o-2"}})
    assert failed.status_code == 502
    response = await server.client.post(
        f"/v1/runs/{client.run_id}/abandon", json={"reason": "husk is dead"}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {
        "run": client.run_id,
        "abandoned": True,
        "appended_seq": 2,
        "status": {
            "state": "abandoned",
            "reason": "husk is dead",
            "unresolved_write": {"seq": 1, "tool": "charge"},
        },
    }
    log = await client.log()
    assert log[1]["event"]["payload"]["seq"] == 1
    assert log[2]["event"] == {
        "kind": "RunAbandoned",
        "payload": {"reason": "husk is dead", "unresolved_write": {"seq": 1, "tool": "charge"}},
    }


# -- logs from before intents named their seq -------------------------------------------------


async def rows_of(store_url: str, run_id: str) -> list[tuple[int, str, dict]]:
    """The run's stored rows as they are on disk: (seq, kind, payload)."""

    def read() -> list:
        engine = sqlalchemy.create_engine(normalize_store_url(store_url))
        try:
            with engine.begin() as connection:
                rows = connection.execute(
                    sqlalchemy.text(
                        "SELECT seq, kind, payload FROM events WHERE run_id = :run_id ORDER BY seq"
                    ),
                    {"run_id": run_id},
                )
                return [(row.seq, row.kind, json.loads(row.payload)) for row in rows]
        finally:
            engine.dispose()

    return await trio.to_thread.run_sync(read)


async def as_written_before(store_url: str, run_id: str) -> int:
    """Rewrite the run's intent rows to the shape stores held before
    intents named their seq; how many."""
    rows = [
        (seq, payload) for seq, kind, payload in await rows_of(store_url, run_id) if kind in INTENTS
    ]
    for seq, payload in rows:
        payload.pop("seq", None)
        await raw_sql(
            store_url,
            "UPDATE events SET payload = :payload WHERE run_id = :run_id AND seq = :seq",
            payload=json.dumps(payload, separators=(",", ":")),
            run_id=run_id,
            seq=seq,
        )
    return len(rows)


async def test_a_log_written_before_intents_named_their_seq_still_folds_reads_and_resumes(
    server_factory, providers, store_url
) -> None:
    first = await server_factory()
    agent, provider = await register(
        first,
        providers,
        [("request_approval", {"reason": "refund over 100"})],
        final_text="approved",
    )
    run_id, parked = await rested(first, agent)
    # A crash mid model call, under an agent no daemon here holds:
    # recovery leaves it exactly as it is.
    crashed = await seed_run(
        first, "sha256:" + "f" * 64, ModelCallRequested(request_hash="sha256:" + "0" * 64)
    )
    await first.stop()
    assert await as_written_before(store_url, run_id) == 2
    assert await as_written_before(store_url, crashed) == 1
    old_rows = await rows_of(store_url, run_id)
    assert all("seq" not in payload for _, kind, payload in old_rows if kind in INTENTS)

    server = await server_factory()
    assert (await get_run(server, run_id))["status"] == parked["status"]
    replay = (await server.client.get(f"/v1/runs/{run_id}/replay")).json()
    assert replay == {
        "status": parked["status"],
        "usage": parked["usage"],
        "next_seq": len(old_rows),
        "pending": None,
    }
    pending = (await get_run(server, crashed))["pending"]
    assert pending == {"kind": "model", "seq": 1, "request_hash": "sha256:" + "0" * 64}
    response = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"approved": True}}
    )
    assert response.status_code == 202, response.text
    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "approved"}
    assert (
        provider.call_count == 2
    )  # the recorded model call was replayed from the old rows, not made again
    # The old rows stay as they were (the log is append-only); the new ones name their
    # seq; a reader sees it on both.
    rows = await rows_of(store_url, run_id)
    assert rows[: len(old_rows)] == old_rows
    assert [payload["seq"] for seq, kind, payload in rows[len(old_rows) :] if kind in INTENTS] == [
        seq for seq, kind, _ in rows[len(old_rows) :] if kind in INTENTS
    ]
    frames = await SpecClient(server.client, run_id).stream()
    log = [json.loads(fields["data"]) for fields, _ in frames[:-1]]
    assert len(log) == len(rows) and sum(e["event"]["kind"] in INTENTS for e in log) == 3
    check_envelopes(log, run_id)
