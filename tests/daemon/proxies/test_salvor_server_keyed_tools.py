"""A keyed registry write attached at run time, called by a process agent through the ``salvor``
MCP server: the relayed call claims the identity a built-in agent's call of the tool claims (the
tool's key fields, no server named), so two process runs refunding one invoice refund it once,
and so do a built-in and a process run, whichever goes first. The run that copies gets the
outcome in its own shape: a process agent an MCP ``tools/call`` result, as the relay answers a
performed call; a built-in agent the tool's output, as its own call records it. An open relayed
write found after the drive stopped inside it is settled by the tool's probe on recovery.

Both backends: what is tested is the identity each run claims in the store.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import trio
from salvor.daemon.tools import ToolRegistry, demo_registry
from salvor.protocol import EventKind, RunState

from tests.daemon.proxies.test_salvor_server import salvor_agent, steps_script, tool_results
from tests.support.flows import tool_results as builtin_results
from tests.support.flows import tool_use
from tests.support.runtime import ledger, with_registry
from tests.support.scripted_provider import text_reply

REFUND = {"invoice_id": "INV-7", "amount_cents": 1200}


def refunds(effects_path) -> list[dict]:
    """The refunds the demo bank answered (one per real execution)."""
    return [e for e in ledger(effects_path) if e["tool"] == "issue_refund"]


def refund_call(log):
    """The intent and completion of the one ``issue_refund`` call in ``log`` (a built-in agent's
    call, or one the ``salvor`` lane relayed)."""
    [intent] = [
        e
        for e in log
        if e.kind == "ToolCallRequested"
        and (e.event.tool == "issue_refund" or e.event.input.get("name") == "issue_refund")
    ]
    [done] = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    return intent, done


async def process_refund(runtime, providers, upstream_env, tmp_path) -> tuple[str, dict]:
    """A process run attached ``issue_refund`` that refunds ``INV-7``: its id, and the refund
    its model was handed (the text of the MCP result its agent got, read as JSON)."""
    provider = providers(steps_script(lambda _: ("issue_refund", REFUND), lambda r: f"got {r[0]}"))
    upstream_env(provider)
    agent = salvor_agent(tmp_path)
    run_id = await runtime.starts.start_run(agent, "refund INV-7")
    await runtime.tools.attach(run_id, ["issue_refund"])
    view = await runtime.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED, view.detail
    assert "issue_refund" in [t["name"] for t in provider.calls[0].request["tools"]]
    _, done = refund_call(await runtime.reads.log(run_id))
    # Recorded and answered as the relay answers a performed call: an MCP tools/call result.
    result = done.output["result"]
    assert result["isError"] is False
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    return run_id, json.loads(tool_results(provider.calls[1])[0])


async def builtin_refund(runtime, providers, make_agent) -> tuple[str, dict]:
    """A built-in run attached ``issue_refund`` that refunds ``INV-7``: its id, and the refund
    its model was handed."""
    provider = providers([tool_use("issue_refund", REFUND), text_reply("refunded")])
    agent = make_agent(provider)
    run_id = await runtime.starts.start_run(agent, "refund INV-7")
    await runtime.tools.attach(run_id, ["issue_refund"])
    view = await runtime.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED, view.detail
    _, done = refund_call(await runtime.reads.log(run_id))
    # The tool's output itself, as the built-in agent's own call records it.
    assert set(done.output) == {"refund_id", "invoice_id", "amount_cents"}
    (handed,) = builtin_results(provider.calls[1])
    assert json.loads(handed["content"]) == done.output
    return run_id, done.output


async def assert_one_refund(runtime, registry, effects_path, first: str, second: str) -> None:
    """``second`` copied ``first``'s refund under the identity a built-in call claims."""
    assert len(refunds(effects_path)) == 1
    first_intent, _ = refund_call(await runtime.reads.log(first))
    intent, done = refund_call(await runtime.reads.log(second))
    identity = registry.get("issue_refund").call_identity(REFUND)
    assert first_intent.event.idempotency_key == intent.event.idempotency_key == identity
    assert done.deduplicated_from == {"run_id": first, "seq": first_intent.seq}


async def test_two_process_runs_refunding_one_invoice_refund_it_once(
    runtime, registry, providers, upstream_env, tmp_path, effects_path
):
    first, handed_first = await process_refund(runtime, providers, upstream_env, tmp_path)
    second, handed_second = await process_refund(runtime, providers, upstream_env, tmp_path)
    await assert_one_refund(runtime, registry, effects_path, first, second)
    assert handed_first == handed_second == refunds(effects_path)[0]["refund"]


@pytest.mark.parametrize("process_first", [False, True], ids=["built_in_first", "process_first"])
async def test_a_built_in_and_a_process_run_refunding_one_invoice_refund_it_once(
    runtime, registry, providers, upstream_env, make_agent, tmp_path, effects_path, process_first
):
    async def process() -> tuple[str, dict]:
        return await process_refund(runtime, providers, upstream_env, tmp_path)

    async def built_in() -> tuple[str, dict]:
        return await builtin_refund(runtime, providers, make_agent)

    first, second = (process, built_in) if process_first else (built_in, process)
    first_run, handed_first = await first()
    assert len(refunds(effects_path)) == 1
    second_run, handed_second = await second()
    await assert_one_refund(runtime, registry, effects_path, first_run, second_run)
    # Each model was handed the one refund the bank made, in the shape its own call gives.
    assert handed_first == handed_second == refunds(effects_path)[0]["refund"]


def holding_refund(registry: ToolRegistry, sent: trio.Event) -> ToolRegistry:
    """``registry`` whose ``issue_refund`` refunds, then holds its answer until cancelled."""
    refund = registry.get("issue_refund")

    async def refund_and_hold(args, call):
        await refund.handler(args, call)
        sent.set()
        await trio.sleep_forever()

    tools = [registry.get(name) for name in registry.names() if registry.get(name) is not None]
    return ToolRegistry(
        [replace(refund, handler=refund_and_hold) if t is refund else t for t in tools]
    )


async def test_a_relayed_refund_stopped_after_it_landed_is_settled_by_its_probe(
    runtime, providers, upstream_env, tmp_path, effects_path
):
    """The refund reached the bank and the drive stopped before its completion was recorded:
    the restarted daemon drives the parked run again, the agent's replay reaches the call and
    the lane probes it with ``lookup_refund``, finding it landed; it is never sent again."""
    provider = providers(steps_script(lambda _: ("issue_refund", REFUND), lambda r: f"got {r[0]}"))
    upstream_env(provider)
    agent = salvor_agent(tmp_path)
    sent = trio.Event()
    holding = with_registry(runtime, holding_refund(demo_registry(str(effects_path)), sent))
    run_id = await holding.starts.start_run(agent, "refund INV-7")
    await holding.tools.attach(run_id, ["issue_refund"])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: holding.drive(run_id, agent=agent))
        with trio.fail_after(30):
            await sent.wait()
        nursery.cancel_scope.cancel()
    assert (await runtime.reads.view(run_id)).state is RunState.NEEDS_RECONCILIATION

    restarted = with_registry(runtime, demo_registry(str(effects_path)))
    assert run_id in await restarted.reads.interrupted_runs()
    view = await restarted.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED, view.detail
    assert len(refunds(effects_path)) == 1
    sends = [e for e in ledger(effects_path) if e["tool"] == "issue_refund:sent"]
    assert len(sends) == 1
    intent, done = refund_call(await restarted.reads.log(run_id))
    assert intent.event.effect == "write"
    assert done.settled_by == "probe"
    landed = refunds(effects_path)[0]["refund"]
    assert json.loads(done.output["result"]["content"][0]["text"]) == landed
    assert json.loads(tool_results(provider.calls[-1])[0]) == landed
