"""``RunControl.resolve`` with ``not_landed`` and ``RunReads.reconciliations``, over a real store.

A keyed write whose outcome was lost parks its run with the identity's claim open; a second run
with the same identity is stopped (``CallInFlight``) until a person settles the first. A person
who checked that the write did not happen records it as not landed: the claim is given up, the
second run performs the write under the same key, and the first run's model is told.
"""

from __future__ import annotations

import pytest
from salvor.daemon.recording import CallInFlight
from salvor.daemon.runs import MISSING, Runtime
from salvor.daemon.tools import OutcomeUnknown, ToolRegistry
from salvor.protocol import TOOL_ERROR_KEY, Effect, RunState

from tests.daemon.agents.test_claims import (
    IDENTITY,
    REFUND,
    CountingRefund,
    refund_agent,
    refund_calls,
    refund_tool,
)
from tests.daemon.agents.test_loop import assert_log_is_sound
from tests.support.runtime import with_registry


@pytest.fixture
def refund() -> CountingRefund:
    return CountingRefund()


async def parked_on_a_lost_refund(runtime, providers, refund) -> tuple[Runtime, str]:
    """A run parked on a refund whose outcome was lost, and the runtime (whose registry holds
    that refund) that drove it."""

    async def lost(tool_input, call):
        refund.calls.append(call)
        raise OutcomeUnknown("the payment API timed out")

    runtime = with_registry(runtime, ToolRegistry([refund_tool(lost, Effect.WRITE)]))
    agent = refund_agent(providers, [("refund", REFUND)])
    run_id = await runtime.starts.start_run(agent, None)
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.NEEDS_RECONCILIATION
    return runtime, run_id


async def test_not_landed_fails_the_call_and_frees_its_identity(
    runtime, providers, refund, monkeypatch
) -> None:
    runtime, parked = await parked_on_a_lost_refund(runtime, providers, refund)
    monkeypatch.setenv("SALVOR_CLAIM_WAIT_SECONDS", "0")
    agent_b = refund_agent(providers, [("refund", REFUND)])
    second = await runtime.starts.start_run(agent_b, None)
    with pytest.raises(CallInFlight):
        await runtime.drive(second, agent=agent_b)
    [queued] = (await runtime.reads.reconciliations({}))[0]
    assert queued.to_json()["run"] == parked
    assert queued.to_json()["idempotency_key"] == IDENTITY

    view = await runtime.control.resolve(parked, MISSING, {}, not_landed=True)
    assert view.state is RunState.RUNNING and view.pending is None
    [(_, _, done)] = refund_calls(await runtime.reads.log(parked))
    assert done.settled_by == "operator" and done.deduplicated_from is None
    assert done.output[TOOL_ERROR_KEY]["kind"] == "not_landed"
    assert await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY) is None
    assert (await runtime.reads.reconciliations({}))[0] == []

    # The identity is free: the second run performs the refund, under the same key.
    runtime = with_registry(runtime, ToolRegistry([refund.tool()]))
    assert (await runtime.drive(second, agent=agent_b)).state is RunState.COMPLETED
    assert [(c.run_id, c.idempotency_key) for c in refund.calls[1:]] == [(second, IDENTITY)]
    [(_, _, performed)] = refund_calls(await assert_log_is_sound(runtime, second))
    assert performed.deduplicated_from is None and performed.output == {"refunded": 1250}
    # The first run goes on: its model was told the write failed, and it answered.
    assert (await runtime.drive(parked)).state is RunState.COMPLETED
    await assert_log_is_sound(runtime, parked)


async def test_resolving_with_an_output_settles_the_identity_for_the_next_caller(
    runtime, providers, refund
) -> None:
    runtime, parked = await parked_on_a_lost_refund(runtime, providers, refund)
    await runtime.control.resolve(parked, {"refunded": 1250}, {})
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert (claim.run_id, claim.state, claim.output) == (parked, "settled", {"refunded": 1250})
    assert (await runtime.reads.reconciliations({}))[0] == []


async def test_only_a_parked_run_is_resolved(runtime, providers, refund) -> None:
    runtime, parked = await parked_on_a_lost_refund(runtime, providers, refund)
    await runtime.control.resolve(parked, MISSING, {}, not_landed=True)
    for not_landed in (True, False):
        with pytest.raises(Exception, match="no dangling write to resolve") as refused:
            await runtime.control.resolve(parked, {"refunded": 1}, {}, not_landed=not_landed)
        assert refused.value.code == "wrong_state"
