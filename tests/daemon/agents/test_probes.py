"""Writes that reconcile themselves: a native write's probe decides its unknown outcome.

A keyed refund acts on a small world (a dict of refunds by invoice) and
counts what it performed; its probe reads that world. Each test drives a
built-in agent over a real store and checks the log, the claim, the
``probe_answers`` row and the count.
"""

from __future__ import annotations

import pytest
import trio
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.runs import ResumeOutcome
from salvor.daemon.tools import (
    OutcomeUnknown,
    Probe,
    Tool,
    ToolCall,
    ToolFailed,
    ToolRegistry,
)
from salvor.protocol import Effect, EventKind, RunState, sha256_hash

from tests.daemon.agents.test_loop import assert_log_is_sound
from tests.support.runtime import agent_toml, with_registry
from tests.support.scripted_provider import tool_loop_script

REFUND = {"invoice": {"id": "INV-7"}, "amount_cents": 1250}
IDENTITY = sha256_hash({"tool": "refund", "invoice.id": "INV-7"})
PROBE = Probe(tool="find_refund", input={"invoice": "invoice.id"}, landed="found", output="refund")


class World:
    """The refunds that happened, and the write and probe that act on them.

    ``lose``: how many of the next refunds end ``OutcomeUnknown``; ``land``
    says whether such a lost refund happened anyway. ``answer`` replaces the
    probe's own answer; ``probe_fails`` makes every probe attempt fail.
    """

    def __init__(self) -> None:
        self.refunds: dict[str, dict] = {}
        self.performed: list[ToolCall] = []
        self.probed: list[dict] = []
        self.lose = 0
        self.land = True
        self.answer = None
        self.probe_fails = False
        self.hold: trio.Event | None = None
        self.entered = trio.Event()

    async def refund(self, tool_input, call: ToolCall):
        invoice = tool_input["invoice"]["id"]
        refund = {"refund_id": f"rf_{invoice}", "amount_cents": tool_input["amount_cents"]}
        if self.lose:
            self.lose -= 1
            if self.land:
                self.performed.append(call)
                self.refunds[invoice] = refund
            raise OutcomeUnknown("the payment API timed out")
        self.performed.append(call)
        self.refunds[invoice] = refund
        if self.hold is not None:
            self.entered.set()
            await self.hold.wait()
        return refund

    async def find(self, tool_input, call: ToolCall):
        self.probed.append(tool_input)
        if self.probe_fails:
            raise ToolFailed("the refunds API is down")
        if self.answer is not None:
            return self.answer
        refund = self.refunds.get(tool_input["invoice"])
        return {"found": refund is not None, "refund": refund}

    def registry(self) -> ToolRegistry:
        return ToolRegistry(
            [
                Tool(
                    name="find_refund",
                    description="",
                    effect=Effect.READ,
                    input_schema={"type": "object", "required": ["invoice"]},
                    handler=self.find,
                ),
                Tool(
                    name="refund",
                    description="",
                    effect=Effect.WRITE,
                    input_schema={"type": "object"},
                    handler=self.refund,
                    idempotency_keys=("invoice.id",),
                    probe=PROBE,
                ),
            ]
        )


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def registry(world: World) -> ToolRegistry:
    """The world's tools, which the ``runtime`` fixture's drives use."""
    return world.registry()


def refund_agent(providers, plan=(("refund", REFUND),)):
    provider = providers(tool_loop_script(list(plan), final_text="refunded"))
    return parse_definition(
        agent_toml(provider.base_url, tools=["refund"]), "toml", known_tools=["refund"]
    )


def the_refund(log):
    [intent] = [
        e for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED and e.event.tool == "refund"
    ]
    done = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    return intent, (done[0] if done else None)


async def probe_answer(runtime, run_id, seq):
    found = await runtime.access.read(runtime.access.store.claims.probe_answers, [(run_id, seq)])
    return found.get((run_id, seq))


async def test_a_write_found_open_is_settled_by_a_probe_that_finds_it_landed(
    runtime, world, providers
):
    agent = refund_agent(providers)
    run_id = await runtime.starts.start_run(agent, None)
    # The first drive dies inside the write, after the refund happened: its intent stays open.
    world.hold = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.drive, run_id)
        with trio.fail_after(10):
            await world.entered.wait()
        nursery.cancel_scope.cancel()
    assert (await runtime.reads.view(run_id)).state is RunState.NEEDS_RECONCILIATION
    world.hold = None

    # Recovery does not refuse it: the drive probes first, and the probe says it landed.
    decision = await runtime.control.resume(run_id)
    assert decision.outcome is ResumeOutcome.DRIVING
    view = await runtime.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED
    assert len(world.performed) == 1 and world.probed == [{"invoice": "INV-7"}]
    intent, done = the_refund(await assert_log_is_sound(runtime, run_id))
    assert done.settled_by == "probe" and done.deduplicated_from is None
    # The output is the answer's `output` path; the evidence is the probe's own call.
    assert done.output == {"refund_id": "rf_INV-7", "amount_cents": 1250}
    assert done.probe == {
        "tool": "find_refund",
        "input": {"invoice": "INV-7"},
        "answer": {"found": True, "refund": {"refund_id": "rf_INV-7", "amount_cents": 1250}},
    }
    row = await probe_answer(runtime, run_id, intent.seq)
    assert (row.verdict, row.error, row.answer) == ("landed", None, done.probe["answer"])

    # The probe settled the write's claim: a second run refunding the invoice copies it.
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert (claim.run_id, claim.seq, claim.state) == (run_id, intent.seq, "settled")
    second = refund_agent(providers)
    other = await runtime.starts.start_run(second, None)
    assert (await runtime.drive(other, agent=second)).state is RunState.COMPLETED
    _, copied = the_refund(await runtime.reads.log(other))
    assert copied.deduplicated_from == {"run_id": run_id, "seq": intent.seq}
    assert copied.output == done.output and len(world.performed) == 1


async def test_a_lost_write_the_probe_finds_not_landed_is_performed_again_once(
    runtime, world, providers
):
    world.lose, world.land = 1, False
    agent = refund_agent(providers)
    run_id = await runtime.starts.start_run(agent, None)
    view = await runtime.drive(run_id, agent=agent)

    assert view.state is RunState.COMPLETED
    # Lost once (nothing happened), probed, then performed again in the same drive, under
    # the same key: one refund in the world.
    assert [c.idempotency_key for c in world.performed] == [IDENTITY]
    assert world.refunds == {"INV-7": {"refund_id": "rf_INV-7", "amount_cents": 1250}}
    intent, done = the_refund(await assert_log_is_sound(runtime, run_id))
    assert done.settled_by is None and done.output == world.refunds["INV-7"]
    row = await probe_answer(runtime, run_id, intent.seq)
    assert row.verdict == "not_landed" and row.answer == {"found": False, "refund": None}
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert (claim.run_id, claim.state) == (run_id, "settled")


async def test_a_write_lost_again_after_a_not_landed_probe_parks(runtime, world, providers):
    world.lose, world.land = 2, False
    agent = refund_agent(providers)
    run_id = await runtime.starts.start_run(agent, None)
    view = await runtime.drive(run_id, agent=agent)

    # One probe, one more attempt: a provider that keeps losing calls never loops.
    assert view.state is RunState.NEEDS_RECONCILIATION
    assert len(world.probed) == 1 and world.lose == 0 and world.performed == []


async def test_a_probe_that_cannot_tell_parks_the_run_with_its_answer_kept(
    runtime, world, providers
):
    world.lose = 1
    world.answer = {"found": "maybe", "note": "the ledger is catching up"}
    agent = refund_agent(providers)
    run_id = await runtime.starts.start_run(agent, None)
    view = await runtime.drive(run_id, agent=agent)

    assert view.state is RunState.NEEDS_RECONCILIATION and len(world.performed) == 1
    intent, done = the_refund(await assert_log_is_sound(runtime, run_id))
    assert done is None
    row = await probe_answer(runtime, run_id, intent.seq)
    assert (row.tool, row.input, row.answer, row.error, row.verdict) == (
        "find_refund",
        {"invoice": "INV-7"},
        world.answer,
        None,
        "unknown",
    )
    # The claim stays open for the person who resolves it.
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert claim.state == "open"

    # Recovery probes again (the answer may have changed); it still cannot tell.
    world.answer = {"found": None}
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.NEEDS_RECONCILIATION
    assert (await probe_answer(runtime, run_id, intent.seq)).answer == {"found": None}
    assert len(world.performed) == 1

    # The reconciliation queue shows the person what the probe last said.
    [item], _ = await runtime.reads.reconciliations({})
    probe = item.to_json()["probe"]
    assert item.run_id == run_id and isinstance(probe["observed_at"], str)
    assert {k: probe[k] for k in ("tool", "input", "answer", "error", "verdict")} == {
        "tool": "find_refund",
        "input": {"invoice": "INV-7"},
        "answer": {"found": None},
        "error": None,
        "verdict": "unknown",
    }


async def test_a_failing_probe_parks_the_run_after_its_read_retries(runtime, world, providers):
    world.lose = 1
    world.probe_fails = True
    agent = refund_agent(providers)
    run_id = await runtime.starts.start_run(agent, None)
    view = await runtime.drive(run_id, agent=agent)

    assert view.state is RunState.NEEDS_RECONCILIATION
    assert len(world.probed) == 3  # a read's attempts
    intent, done = the_refund(await runtime.reads.log(run_id))
    assert done is None
    row = await probe_answer(runtime, run_id, intent.seq)
    assert row.verdict == "unknown" and row.answer is None
    assert "the refunds API is down" in row.error


async def test_a_probe_whose_input_path_is_missing_cannot_tell(runtime, world, providers):
    world.lose = 1
    agent = refund_agent(providers)
    runtime = with_registry(
        runtime,
        ToolRegistry(
            [
                world.registry().get("find_refund"),
                Tool(
                    name="refund",
                    description="",
                    effect=Effect.WRITE,
                    input_schema={"type": "object"},
                    handler=world.refund,
                    probe=Probe(
                        tool="find_refund", input={"invoice": "invoice.number"}, landed="found"
                    ),
                ),
            ]
        ),
    )
    run_id = await runtime.starts.start_run(agent, None)
    view = await runtime.drive(run_id, agent=agent)

    assert view.state is RunState.NEEDS_RECONCILIATION and world.probed == []
    intent, _ = the_refund(await runtime.reads.log(run_id))
    row = await probe_answer(runtime, run_id, intent.seq)
    assert row.verdict == "unknown" and row.input == {}
    assert "`invoice.number`" in row.error


def test_only_a_write_has_a_probe_and_its_read_must_be_registered():
    def tool(name, effect, probe=None):
        return Tool(
            name=name,
            description="",
            effect=effect,
            input_schema={},
            handler=None,
            probe=probe,
        )

    with pytest.raises(ValueError, match="only a write has a probe"):
        tool("send", Effect.IDEMPOTENT, PROBE)
    with pytest.raises(ValueError, match="not a registered read tool"):
        ToolRegistry([tool("refund", Effect.WRITE, PROBE)])
    with pytest.raises(ValueError, match="not a registered read tool"):
        ToolRegistry([tool("find_refund", Effect.WRITE), tool("refund", Effect.WRITE, PROBE)])
    registry = ToolRegistry([tool("refund", Effect.WRITE, PROBE), tool("find_refund", Effect.READ)])
    assert registry.probe_of(registry.get("refund")).name == "find_refund"
    with pytest.raises(ValueError, match="dotted path"):
        Probe(tool="find_refund", input={"invoice": "a..b"}, landed="found")


@pytest.mark.parametrize(
    ("answer", "verdict", "output"),
    [
        ({"found": True, "refund": {"id": 1}}, "landed", {"id": 1}),
        ({"found": False}, "not_landed", None),
        ({"found": "yes", "refund": {"id": 1}}, "unknown", None),
        ({"found": 1, "refund": {"id": 1}}, "unknown", None),
        ({"refund": {"id": 1}}, "unknown", None),
        ({"found": True}, "unknown", None),
        ("found", "unknown", None),
        (None, "unknown", None),
    ],
)
def test_a_probe_answer_decides_only_on_a_boolean(answer, verdict, output):
    probe = Probe(tool="find_refund", input={}, landed="found", output="refund")
    assert probe.verdict(answer) == (verdict, output)


# -- an MCP write probed by a read of the same server -------------------------------------


def note_agent(providers, fx, plan, probe_tool="find_note"):
    provider = providers(tool_loop_script(plan, final_text="noted"))
    text = agent_toml(provider.base_url) + (
        f'\n[[mcp_servers]]\nname = "fx"\ncommand = {fx.toml_command("--find-note")}\n'
        'effects = { write_note = "write", find_note = "read", fail_soft = "read" }\n'
        'idempotency_keys = { write_note = "text" }\n'
        "[mcp_servers.probes.write_note]\n"
        f'tool = "{probe_tool}"\ninput = {{ text = "text" }}\nlanded = "found"\noutput = "note"\n'
    )
    return parse_definition(text, "toml")


async def die_inside_the_write(runtime, fx, run_id):
    """Drive until the server has the write, then stop the drive there (its intent stays open)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.drive, run_id)
        with trio.fail_after(10):
            while not fx.calls_of("write_note"):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    fx.release("w")
    assert (await runtime.reads.view(run_id)).state is RunState.NEEDS_RECONCILIATION


def note_call(log):
    [intent] = [
        e
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED and e.event.tool == "write_note"
    ]
    done = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    return intent, (done[0] if done else None)


async def test_an_mcp_write_found_open_is_settled_by_its_servers_read(runtime, providers, fx):
    agent = note_agent(providers, fx, [("write_note", {"text": "INV-7", "hold": fx.hold("w")})])
    run_id = await runtime.starts.start_run(agent, None)
    await die_inside_the_write(runtime, fx, run_id)

    assert (await runtime.control.resume(run_id)).outcome is ResumeOutcome.DRIVING
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
    # The server saw one write and one probe, which carried no key (a read presents none).
    assert len(fx.calls_of("write_note")) == 1
    [probe_call] = fx.calls_of("find_note")
    assert probe_call["arguments"] == {"text": "INV-7"} and probe_call["meta"] is None
    intent, done = note_call(await assert_log_is_sound(runtime, run_id))
    assert done.settled_by == "probe"
    # The answer is the result's structuredContent; the output its `note`.
    assert done.probe["answer"]["found"] is True
    assert done.output == {"content": [{"type": "text", "text": "noted INV-7"}]}
    claim = await runtime.access.read(
        runtime.access.store.claims.get_claim, intent.event.idempotency_key
    )
    assert (claim.run_id, claim.state, claim.output) == (run_id, "settled", done.output)


async def test_an_mcp_probe_answering_an_error_result_cannot_tell(runtime, providers, fx):
    agent = note_agent(
        providers, fx, [("write_note", {"text": "INV-8", "hold": fx.hold("w")})], "fail_soft"
    )
    run_id = await runtime.starts.start_run(agent, None)
    await die_inside_the_write(runtime, fx, run_id)

    assert (await runtime.drive(run_id, agent=agent)).state is RunState.NEEDS_RECONCILIATION
    assert len(fx.calls_of("write_note")) == 1 and len(fx.calls_of("fail_soft")) == 1
    intent, done = note_call(await runtime.reads.log(run_id))
    assert done is None
    row = await probe_answer(runtime, run_id, intent.seq)
    assert (row.tool, row.verdict, row.answer) == ("fail_soft", "unknown", None)
    assert "error result" in row.error
