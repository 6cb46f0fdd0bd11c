"""Cross-run idempotency claims of built-in agents' native tools, over a real store.

Two runtimes with their own store access (two daemons' worth of writers and
connections) share one store. A counting tool proves how often the effect
happened; the logs say which call performed and which copied its outcome.
"""

from __future__ import annotations

import pytest
import trio
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.recording import open_store_access
from salvor.daemon.runs._runtime import Runtime
from salvor.daemon.tools import Tool, ToolCall, ToolRegistry
from salvor.protocol import Effect, EventKind, RunState, sha256_hash

from tests.daemon.agents.test_loop import assert_log_is_sound
from tests.support.runtime import agent_toml
from tests.support.scripted_provider import tool_loop_script

REFUND = {"invoice": {"id": "INV-7"}, "amount_cents": 1250}
IDENTITY = sha256_hash({"tool": "refund", "invoice.id": "INV-7"})


class CountingRefund:
    """A keyed write that counts what it performed; ``gate`` holds each call in flight."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.entered = trio.Event()
        self.gate = trio.Event()
        self.gate.set()

    async def handler(self, tool_input, call: ToolCall):
        self.calls.append(call)
        self.entered.set()
        await self.gate.wait()
        return {"refunded": tool_input["amount_cents"]}

    def tool(self) -> Tool:
        return Tool(
            name="refund",
            description="Refund an invoice.",
            effect=Effect.WRITE,
            input_schema={"type": "object"},
            handler=self.handler,
            idempotency_keys=("invoice.id",),
        )


@pytest.fixture
def refund() -> CountingRefund:
    return CountingRefund()


@pytest.fixture
def registry(refund) -> ToolRegistry:
    return ToolRegistry([refund.tool()])


def refund_agent(providers, plan):
    provider = providers(tool_loop_script(plan, final_text="refunded"))
    return parse_definition(
        agent_toml(provider.base_url, tools=["refund"]), "toml", known_tools=["refund"]
    )


def completions(log):
    return {e.event.seq: e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED}


def refund_calls(log):
    done = completions(log)
    return [
        (e.seq, e.event, done.get(e.seq))
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED and e.event.tool == "refund"
    ]


def test_the_identity_is_the_tool_and_its_key_fields_only(refund):
    tool = refund.tool()
    assert tool.claims and tool.call_identity(REFUND) == IDENTITY
    # Another amount, the same invoice: the same identity (only the key field counts).
    assert tool.call_identity({"invoice": {"id": "INV-7"}, "amount_cents": 1}) == IDENTITY
    assert tool.call_identity({"invoice": {"id": "INV-8"}}) != IDENTITY


async def test_two_runs_racing_on_one_key_perform_it_once(
    store_url, registry, refund, providers, monkeypatch
):
    agent_a = refund_agent(providers, [("refund", REFUND)])
    agent_b = refund_agent(providers, [("refund", REFUND)])
    async with (
        open_store_access(store_url) as access_a,
        open_store_access(store_url) as access_b,
    ):
        first, second = Runtime(access_a, registry), Runtime(access_b, registry)
        run_a = await first.start_run(agent_a, {"invoice": "INV-7"})
        run_b = await second.start_run(agent_b, {"invoice": "INV-7"})
        # The second caller finds the claim open (the first call is in flight):
        # the gate opens only once it has, so the wait is really exercised.
        saw_open = trio.Event()
        token = trio.lowlevel.current_trio_token()
        original = access_b.store.get_claim

        def get_claim(identity):
            claim = original(identity)
            if claim is not None and claim.state == "open":
                token.run_sync_soon(saw_open.set)
            return claim

        monkeypatch.setattr(access_b.store, "get_claim", get_claim)
        refund.gate = trio.Event()
        views = {}

        async def drive(runtime, run_id, agent):
            views[run_id] = await runtime.drive(run_id, agent=agent)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drive, first, run_a, agent_a)
                await refund.entered.wait()
                nursery.start_soon(drive, second, run_b, agent_b)
                await saw_open.wait()
                refund.gate.set()

        assert views[run_a].state is RunState.COMPLETED
        assert views[run_b].state is RunState.COMPLETED
        # Exactly one refund happened, under the identity as its key.
        assert [(c.run_id, c.idempotency_key) for c in refund.calls] == [(run_a, IDENTITY)]
        [(seq_a, intent_a, done_a)] = refund_calls(await assert_log_is_sound(first, run_a))
        [(_, intent_b, done_b)] = refund_calls(await assert_log_is_sound(second, run_b))
        assert intent_a.idempotency_key == intent_b.idempotency_key == IDENTITY
        assert done_a.deduplicated_from is None and done_a.output == {"refunded": 1250}
        # The second run recorded the first's output, naming where it came from.
        assert done_b.output == done_a.output
        assert done_b.deduplicated_from == {"run_id": run_a, "seq": seq_a}
        claim = await access_a.read(access_a.store.get_claim, IDENTITY)
        assert (claim.run_id, claim.state, claim.output) == (run_a, "settled", {"refunded": 1250})
