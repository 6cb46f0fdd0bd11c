"""Cross-run idempotency claims of built-in agents' native tools, over a real store.

Two runtimes with their own store access (two daemons' worth of writers and
connections) share one store. A counting tool proves how often the effect
happened; the logs say which call performed and which copied its outcome.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import trio
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.recording import CallInFlight, open_store_access
from salvor.daemon.runs._runtime import Runtime
from salvor.daemon.tools import (
    NotPerformed,
    OutcomeUnknown,
    SleepUntil,
    Tool,
    ToolCall,
    ToolFailed,
    ToolRegistry,
)
from salvor.protocol import TOOL_ERROR_KEY, Effect, EventKind, RunState, sha256_hash

from tests.daemon.agents.test_loop import assert_log_is_sound
from tests.support.runtime import agent_toml, with_registry
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
        return refund_tool(self.handler, Effect.WRITE)


@pytest.fixture
def refund() -> CountingRefund:
    return CountingRefund()


@pytest.fixture
def registry(refund) -> ToolRegistry:
    return ToolRegistry([refund.tool()])


def refund_tool(handler, effect: Effect, keys=("invoice.id",)) -> Tool:
    return Tool(
        name="refund",
        description="",
        effect=effect,
        input_schema={"type": "object"},
        handler=handler,
        idempotency_keys=keys,
    )


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
        run_a = await first.starts.start_run(agent_a, {"invoice": "INV-7"})
        run_b = await second.starts.start_run(agent_b, {"invoice": "INV-7"})
        # The second caller finds the claim open (the first call is in flight):
        # the gate opens only once it has, so the wait is really exercised.
        saw_open = trio.Event()
        token = trio.lowlevel.current_trio_token()
        original = access_b.store.claims.get_claim

        def get_claim(identity):
            claim = original(identity)
            if claim is not None and claim.state == "open":
                token.run_sync_soon(saw_open.set)
            return claim

        monkeypatch.setattr(access_b.store.claims, "get_claim", get_claim)
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
        claim = await access_a.read(access_a.store.claims.get_claim, IDENTITY)
        assert (claim.run_id, claim.state, claim.output) == (run_a, "settled", {"refunded": 1250})


def test_an_mcp_tools_identity_names_its_server():
    def tool(server):
        return Tool(
            name="pay",
            description="",
            effect=Effect.WRITE,
            input_schema={},
            handler=None,
            idempotency_keys=("id",),
            mcp_server=server,
        )

    assert tool("a").call_identity({"id": 1}) == sha256_hash(
        {"tool": "pay", "mcp_server": "a", "id": 1}
    )
    assert tool("a").call_identity({"id": 1}) != tool("b").call_identity({"id": 1})


@pytest.mark.parametrize("paths", [("",), ("a..b",), ("tool",), ("a", "a"), "id"])
def test_bad_key_paths_are_refused_when_the_tool_is_made(paths):
    with pytest.raises(ValueError, match="idempotency_keys"):
        Tool(
            name="pay",
            description="",
            effect=Effect.WRITE,
            input_schema={},
            handler=None,
            idempotency_keys=paths,
        )


async def test_the_same_identity_twice_in_one_run_is_performed_once(runtime, refund, providers):
    agent = refund_agent(
        providers, [("refund", REFUND), ("refund", {**REFUND, "note": "asked again"})]
    )
    run_id = await runtime.starts.start_run(agent, None)
    view = await runtime.drive(run_id, agent=agent)

    assert view.state is RunState.COMPLETED and len(refund.calls) == 1
    (seq, _, done), (_, _, again) = refund_calls(await assert_log_is_sound(runtime, run_id))
    assert again.output == done.output and again.deduplicated_from == {
        "run_id": run_id,
        "seq": seq,
    }


async def test_a_call_missing_a_key_field_fails_as_a_recorded_tool_error(
    runtime, refund, providers, store
):
    agent = refund_agent(providers, [("refund", {"amount_cents": 5})])
    run_id = await runtime.starts.start_run(agent, None)
    view = await runtime.drive(run_id, agent=agent)

    assert view.state is RunState.COMPLETED and refund.calls == []
    [(_, intent, done)] = refund_calls(await runtime.reads.log(run_id))
    assert intent.idempotency_key is None
    error = done.output[TOOL_ERROR_KEY]
    assert error["kind"] == "invalid_input" and "`invoice.id`" in error["message"]


async def test_a_read_never_claims_whatever_it_declares(runtime, providers):
    seen = []

    async def look(tool_input, call):
        seen.append(call.idempotency_key)
        return {"found": len(seen)}

    lookup = refund_tool(look, Effect.READ)
    runtime = with_registry(runtime, ToolRegistry([lookup]))
    for _ in range(2):
        agent = refund_agent(providers, [("refund", REFUND)])
        run_id = await runtime.starts.start_run(agent, None)
        assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
        [(_, _, done)] = refund_calls(await runtime.reads.log(run_id))
        assert done.deduplicated_from is None
    # Both performed, neither under a key; and no claim was written.
    assert seen == [None, None]
    assert await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY) is None


async def test_a_dead_idempotent_call_is_performed_again_under_its_own_claim(
    runtime, providers, refund
):
    # The first attempt dies with its intent (and claim) open; the next drive
    # finds its own claim open and performs the call again under the same key.
    async def flaky(tool_input, call):
        refund.calls.append(call)
        if len(refund.calls) == 1:
            raise NotPerformed("the connection dropped")
        return {"refunded": 1}

    runtime = with_registry(runtime, ToolRegistry([refund_tool(flaky, Effect.IDEMPOTENT)]))
    agent = refund_agent(providers, [("refund", REFUND)])
    run_id = await runtime.starts.start_run(agent, None)
    with pytest.raises(Exception, match="the connection dropped"):
        await runtime.drive(run_id, agent=agent)
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert (claim.run_id, claim.state) == (run_id, "open")

    view = await runtime.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED
    assert [c.idempotency_key for c in refund.calls] == [IDENTITY, IDENTITY]
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert (claim.run_id, claim.seq, claim.state) == (run_id, claim.seq, "settled")


async def test_an_idempotent_call_without_key_fields_presents_its_positions_key(runtime, providers):
    keys = []

    async def send(tool_input, call):
        keys.append(call.idempotency_key)
        if len(keys) == 1:
            raise NotPerformed("not now")
        return "sent"

    runtime = with_registry(runtime, ToolRegistry([refund_tool(send, Effect.IDEMPOTENT, keys=())]))
    agent = refund_agent(providers, [("refund", REFUND)])
    run_id = await runtime.starts.start_run(agent, None)
    with pytest.raises(Exception, match="not now"):
        await runtime.drive(run_id, agent=agent)
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
    [(seq, intent, _)] = refund_calls(await runtime.reads.log(run_id))
    derived = sha256_hash({"run": run_id, "seq": seq, "tool": "refund"})
    assert keys == [derived, derived] and intent.idempotency_key == derived


async def test_a_write_parked_on_its_open_claim_stops_the_next_caller_until_resolved(
    runtime, providers, refund, monkeypatch
):
    async def lost(tool_input, call):
        refund.calls.append(call)
        raise OutcomeUnknown("the payment API timed out")

    runtime = with_registry(runtime, ToolRegistry([refund_tool(lost, Effect.WRITE)]))
    agent_a = refund_agent(providers, [("refund", REFUND)])
    run_a = await runtime.starts.start_run(agent_a, None)
    assert (await runtime.drive(run_a, agent=agent_a)).state is RunState.NEEDS_RECONCILIATION

    # The second caller does not perform: the claim is open. It waits its bound, then stops
    # with nothing of its call written.
    monkeypatch.setenv("SALVOR_CLAIM_WAIT_SECONDS", "0.05")
    agent_b = refund_agent(providers, [("refund", REFUND)])
    run_b = await runtime.starts.start_run(agent_b, None)
    with pytest.raises(CallInFlight) as stopped:
        await runtime.drive(run_b, agent=agent_b)
    assert stopped.value.claim.run_id == run_a and len(refund.calls) == 1
    assert refund_calls(await assert_log_is_sound(runtime, run_b)) == []
    assert [e.event.KIND for e in await runtime.reads.log(run_b)][
        -1
    ] is EventKind.MODEL_CALL_COMPLETED

    # A person records what the write did: that settles the claim, and the next caller copies it.
    await runtime.control.resolve(run_a, {"refunded": 1250}, {})
    view = await runtime.drive(run_b, agent=agent_b)
    assert view.state is RunState.COMPLETED and len(refund.calls) == 1
    [(_, _, done)] = refund_calls(await assert_log_is_sound(runtime, run_b))
    seq_a = refund_calls(await runtime.reads.log(run_a))[0][0]
    assert done.output == {"refunded": 1250}
    assert done.deduplicated_from == {"run_id": run_a, "seq": seq_a}


def note_agent(providers, fx, plan, effect="idempotent"):
    provider = providers(tool_loop_script(plan, final_text="noted"))
    text = agent_toml(provider.base_url) + (
        f'\n[[mcp_servers]]\nname = "fx"\ncommand = {fx.toml_command()}\n'
        f'effects = {{ write_note = "{effect}" }}\nidempotency_keys = {{ write_note = "text" }}\n'
    )
    return parse_definition(text, "toml")


async def test_an_mcp_server_sees_the_key_again_on_a_retry_and_never_for_a_copied_call(
    runtime, providers, fx
):
    note = {"text": "refund INV-7", "hold": fx.hold("w")}
    identity = sha256_hash({"tool": "write_note", "mcp_server": "fx", "text": "refund INV-7"})
    agent_a = note_agent(providers, fx, [("write_note", note)])
    run_a = await runtime.starts.start_run(agent_a, None)
    # The first drive dies mid-call: the server has the call, the run has its open intent.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.drive, run_a)
        with trio.fail_after(10):
            while not fx.calls_of("write_note"):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    fx.release("w")
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, identity)
    assert (claim.run_id, claim.state) == (run_a, "open")
    assert (await runtime.drive(run_a, agent=agent_a)).state is RunState.COMPLETED

    # The retry of the same position carried the same key in `_meta`, where the server sees it.
    first, again = fx.calls_of("write_note")
    assert (
        first["meta"] == again["meta"] == {"salvor": {"idempotency_key": identity, "run_id": run_a}}
    )

    # Another run asking for the same note copies the outcome: the server sees no third call.
    agent_b = note_agent(providers, fx, [("write_note", {"text": "refund INV-7"})])
    run_b = await runtime.starts.start_run(agent_b, None)
    assert (await runtime.drive(run_b, agent=agent_b)).state is RunState.COMPLETED
    assert len(fx.calls_of("write_note")) == 2
    log_a, log_b = await runtime.reads.log(run_a), await runtime.reads.log(run_b)
    (seq_a, _, done_a) = next(c for c in note_calls(log_a))
    (_, intent_b, done_b) = next(c for c in note_calls(log_b))
    assert intent_b.idempotency_key == identity
    assert done_b.output == done_a.output
    assert done_b.deduplicated_from == {"run_id": run_a, "seq": seq_a}


async def test_an_mcp_result_flagged_is_error_releases_its_identity(runtime, providers, fx):
    # The server answered that the call failed: the next caller must perform it, not copy that.
    plan = [("fail_soft", {"text": "refund INV-8"})]
    for _ in range(2):
        provider = providers(tool_loop_script(plan, final_text="tried"))
        text = agent_toml(provider.base_url) + (
            f'\n[[mcp_servers]]\nname = "fx"\ncommand = {fx.toml_command()}\n'
            'effects = { fail_soft = "write" }\nidempotency_keys = { fail_soft = "text" }\n'
        )
        agent = parse_definition(text, "toml")
        run_id = await runtime.starts.start_run(agent, None)
        assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
        [(_, _, failed)] = note_calls_of(await runtime.reads.log(run_id), "fail_soft")
        assert failed.output["isError"] is True and failed.deduplicated_from is None
    assert len(fx.calls_of("fail_soft")) == 2
    identity = sha256_hash({"tool": "fail_soft", "mcp_server": "fx", "text": "refund INV-8"})
    assert await runtime.access.read(runtime.access.store.claims.get_claim, identity) is None


def note_calls(log):
    return note_calls_of(log, "write_note")


def note_calls_of(log, tool):
    done = completions(log)
    return [
        (e.seq, e.event, done.get(e.seq))
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED and e.event.tool == tool
    ]


async def test_a_log_with_the_old_random_key_still_replays(runtime, providers):
    # Before derived keys, an idempotent call recorded a RandomObserved ahead of its intent.
    from salvor.daemon.recording import RunContext
    from salvor.protocol import RandomObserved, ToolCallCompleted, ToolCallRequested

    performed = []

    async def send(tool_input, call):
        performed.append(call)
        return "sent again"

    send_tool = Tool(
        name="send", description="", effect=Effect.IDEMPOTENT, input_schema={}, handler=send
    )
    agent = refund_agent(providers, [])
    run_id = await runtime.starts.start_run(agent, None)
    view = await runtime.reads.view(run_id)
    old = [
        RandomObserved(value="ab" * 16),
        ToolCallRequested(
            tool="send", input={}, effect="idempotent", idempotency_key="idem_" + "ab" * 16
        ),
        ToolCallCompleted(seq=view.next_seq + 1, output="sent"),
    ]
    await runtime.access.append(run_id, old, view)
    log = await runtime.reads.log(run_id)
    ctx = RunContext(runtime.access, run_id, log)
    ctx.cursor.take(EventKind.RUN_STARTED)

    assert await ctx.tool_call(send_tool, {}) == "sent" and ctx.live and performed == []


async def test_a_failed_call_releases_its_identity_for_the_next_caller(runtime, providers, refund):
    async def declined(tool_input, call):
        refund.calls.append(call)
        if len(refund.calls) == 1:
            raise ToolFailed("the bank declined", retryable=False)
        return {"refunded": 1250}

    runtime = with_registry(runtime, ToolRegistry([refund_tool(declined, Effect.WRITE)]))
    outcomes = []
    for _ in range(2):
        agent = refund_agent(providers, [("refund", REFUND)])
        run_id = await runtime.starts.start_run(agent, None)
        assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
        [(_, _, done)] = refund_calls(await runtime.reads.log(run_id))
        outcomes.append((run_id, done))
    (first, failed), (second, performed) = outcomes
    # The failure left nothing to copy: the second run performed the refund itself.
    assert "the bank declined" in failed.output[TOOL_ERROR_KEY]["message"]
    assert performed.deduplicated_from is None and performed.output == {"refunded": 1250}
    assert [c.run_id for c in refund.calls] == [first, second]
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert (claim.run_id, claim.state) == (second, "settled")


async def test_a_keyed_call_that_puts_its_run_to_sleep_settles_its_claim_in_that_write(
    runtime, providers, refund, clock, monkeypatch
):
    async def sleeps(tool_input, call):
        refund.calls.append(call)
        return SleepUntil(wake_at=clock.now + timedelta(hours=1))

    runtime = with_registry(runtime, ToolRegistry([refund_tool(sleeps, Effect.WRITE)]))
    access = runtime.access
    appends = []
    append = access.append

    async def observed(run_id, events, view, **claims):
        appends.append(([event.KIND for event in events], claims))
        return await append(run_id, events, view, **claims)

    monkeypatch.setattr(access, "append", observed)
    # A claim left open would stop the next caller within this bound, not let it copy.
    monkeypatch.setenv("SALVOR_CLAIM_WAIT_SECONDS", "0.05")
    agent = refund_agent(providers, [("refund", REFUND)])
    first = await runtime.starts.start_run(agent, None)
    assert (await runtime.drive(first, agent=agent)).state is RunState.SLEEPING

    (asleep,) = [(kinds, claims) for kinds, claims in appends if EventKind.SLEEP_STARTED in kinds]
    assert EventKind.TOOL_CALL_COMPLETED in asleep[0]
    assert asleep[1]["settle"] == IDENTITY and not asleep[1].get("release")
    claim = await access.read(access.store.claims.get_claim, IDENTITY)
    [(seq, _, done)] = refund_calls(await runtime.reads.log(first))
    assert (claim.run_id, claim.seq, claim.state, claim.output) == (
        first,
        seq,
        "settled",
        done.output,
    )

    agent = refund_agent(providers, [("refund", REFUND)])
    second = await runtime.starts.start_run(agent, None)
    assert (await runtime.drive(second, agent=agent)).state is RunState.SLEEPING
    [(_, _, copied)] = refund_calls(await runtime.reads.log(second))
    assert copied.deduplicated_from == {"run_id": first, "seq": seq}
    assert copied.output == done.output and len(refund.calls) == 1
