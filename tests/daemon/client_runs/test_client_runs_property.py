"""Property: two clients racing on one client-driven run never break its log, and a
declared key never lands twice.

Hypothesis picks an interleaving of two clients' moves (open or re-open,
take the next step of their loop, release the lease). Each client drives the
same loop from its own view of the log: a head, then a charge through a
declared client tool (key derived from the order), then clock readings, then
a second charge of the same order. Whatever the order, against a real
daemon over real HTTP:

* no request is answered with a 5xx;
* the recorded log passes the append guard from its first event;
* the charge's key completes from a client report at most once: any later
  call with the same key is a copy (``deduplicated_from``), never a new landing.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from salvor.daemon.client_runs._client_tools import parse_declaration
from salvor.daemon.serve._serve import ServeConfig, serve
from salvor.protocol import EMPTY_VIEW, check_batch, decode_envelope

CHARGE = parse_declaration(
    'name = "charge"\neffect = "write"\ntrust_completion = true\nidempotency_key = ["order"]\n'
    '[input_schema]\ntype = "object"\nrequired = ["order"]\n[output_schema]\ntype = "object"\n',
    "toml",
)
AGENT = "sha256:" + "cd" * 32


class Client:
    """One driver's loop, from its own (possibly stale) view of the log."""

    def __init__(self, http: httpx.AsyncClient, run_id: str, performed: list[str]) -> None:
        self.http, self.run_id, self.performed = http, run_id, performed
        self.token: str | None = None
        self.log: list[dict] = []
        self.statuses: list[int] = []
        self.unreported: int | None = (
            None  # the seq of a call it performed and has not reported yet
        )

    async def _post(self, path: str, body=None) -> httpx.Response:
        headers = {"X-Drive-Token": self.token} if self.token else {}
        reply = await self.http.post(path, json=body, headers=headers)
        self.statuses.append(reply.status_code)
        return reply

    async def open(self) -> None:
        reply = await self._post("/v1/client-runs", {"run_id": self.run_id})
        if reply.status_code in (200, 201):
            self.token, self.log = reply.json()["drive_token"], reply.json()["log"]

    async def release(self) -> None:
        await self._post(f"/v1/client-runs/{self.run_id}/release")

    async def step(self) -> None:
        seq = len(self.log)
        last = self.log[-1]["event"] if self.log else None
        charges = sum(1 for e in self.log if e["event"]["kind"] == "ToolCallRequested")
        if not self.log:
            reply = await self._append(
                "RunStarted", {"agent_def_hash": AGENT, "input": {"order": "o-1"}}
            )
        elif last["kind"] == "ToolCallRequested":
            intent_seq = seq - 1
            if self.unreported == intent_seq:
                # It performed this call itself: report what came back.
                reply = await self._post(
                    f"/v1/client-runs/{self.run_id}/client-tool-completion",
                    {"seq": intent_seq, "output": {"charged": True}},
                )
                self.unreported = None
            else:
                # An open charge someone else left (or this driver forgot): the same position gives
                # the same key back, so performing it again is collapsed by the provider.
                reply = await self._charge(intent_seq)
        elif charges < 2 and (charges == 0 or seq >= 5):
            reply = await self._charge(seq)
        else:
            reply = await self._append("NowObserved", {"now": f"2026-11-29T10:00:00.{seq:06d}Z"})
        if reply.status_code != 200:
            # Refused: re-read the log, as a real client rebuilding its cursor would.
            self.log = (
                (await self.http.get(f"/v1/client-runs/{self.run_id}/log"))
                .json()
                .get("log", self.log)
            )
        else:
            self.log = (await self.http.get(f"/v1/client-runs/{self.run_id}/log")).json()["log"]

    async def _charge(self, seq: int) -> httpx.Response:
        """Open the charge at ``seq`` and, unless it is already settled, perform it
        (reported on a later step)."""
        reply = await self._post(
            f"/v1/client-runs/{self.run_id}/client-tool-intent",
            {"seq": seq, "tool": "charge", "input": {"order": "o-1"}},
        )
        if reply.status_code == 200 and not reply.json()["settled"]:
            self.performed.append(reply.json()["idempotency_key"])
            self.unreported = seq
        return reply

    async def _append(self, kind: str, payload: dict) -> httpx.Response:
        envelope = {
            "run_id": self.run_id,
            "seq": len(self.log),
            "schema_version": 1,
            "recorded_at": "2026-01-01T00:00:00.000000Z",
            "event": {"kind": kind, "payload": payload},
        }
        return await self._post(f"/v1/client-runs/{self.run_id}/events", {"events": [envelope]})


# Mostly steps, so loops get far enough to charge twice; releases hand the run over.
MOVES = st.lists(
    st.tuples(st.sampled_from([0, 0, 1]), st.sampled_from(["open", "release", *["step"] * 8])),
    min_size=30,
    max_size=80,
)


# Each example is a daemon and some 50 moves over HTTP (about a third of a CPU-second). At 60
# examples every refusal it reports but a 404 was reached in two thirds of them or more, and a
# deduplicated repeat in four fifths: 30 miss one of those with a chance below 1e-14.
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(moves=MOVES)
def test_two_racing_clients_never_break_the_log(tmp_path: Path, moves) -> None:
    trio.run(_scenario, tmp_path / f"{uuid.uuid4().hex}.db", moves)


async def _scenario(db: Path, moves) -> None:
    config = ServeConfig(
        host="127.0.0.1",
        port=0,
        store_url=f"sqlite:///{db}",
        wake_interval=0,
        shutdown_seconds=5.0,
        client_tools={"charge": CHARGE},
    )
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(config, stop=stop, task_status=task_status)
        )
        url = next(b for b in binds if b.startswith("http://"))
        run_id = str(uuid.uuid4())
        performed: list[str] = []
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            clients = [Client(http, run_id, performed), Client(http, run_id, performed)]
            for who, move in [(0, "open"), *moves]:
                await getattr(clients[who], move)()
            log = (await http.get(f"/v1/client-runs/{run_id}/log")).json().get("log", [])
        stop.set()
    assert all(status < 500 for c in clients for status in c.statuses), [
        c.statuses for c in clients
    ]
    envelopes = [decode_envelope(e) for e in log]
    check_batch(EMPTY_VIEW, envelopes)  # the whole log is legal from its first event
    landed = [
        e for e in envelopes if e.kind == "ToolCallCompleted" and e.event.deduplicated_from is None
    ]
    keys = {e.seq: e.event.idempotency_key for e in envelopes if e.kind == "ToolCallRequested"}
    assert len({keys[e.event.seq] for e in landed}) == len(landed), json.dumps(log)[:3000]
    # Every performance used the one key the daemon derives for this order.
    assert len(set(performed)) <= 1
    # What the interleavings reached (shown by --hypothesis-show-statistics).
    for status in sorted({s for c in clients for s in c.statuses if s not in (200, 201)}):
        event(f"a refusal {status}")
    if any(e.kind == "ToolCallCompleted" and e.event.deduplicated_from for e in envelopes):
        event("a repeated charge was deduplicated")
    if len(performed) > 1:
        event("two performances of one key (collapsed by the key)")
