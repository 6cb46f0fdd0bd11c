"""A run stopped on another run's open claim goes on by itself once that claim settles.

Two graph runs, each a tool node calling one keyed write with the same
invoice, over a real store, in virtual time. The first run's call is held in
flight; the second waits its bound and stops with ``CallInFlight``, resting
``running`` with no driver. When the first call completes (in this process:
its commit wakes the wait; from another store access, as a `salvor resume`
in a shell would: the fallback poll finds it) the second run is driven again
with nobody resuming it, copies the first call's outcome, and completes; the
write was performed once.

The clock jumps only once every task has been blocked a while in real time, and the test waits
in short sleeps: the store's writer and reader threads answer in real time, and a jump taken
while one works would skip straight to the next deadline. A ticker (``ticking``) keeps a deadline
``TICK`` ahead at all times, so a thread stalled under load moves the clock by ticks, never
straight to a poll or to the test's bound.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from salvor.daemon.recording import open_store_access
from salvor.daemon.runs._drivers import DriverSet
from salvor.daemon.runs._runtime import Runtime
from salvor.daemon.tools import OutcomeUnknown, ToolRegistry
from salvor.protocol import Effect, EventKind, RunState, graph_from_value

from tests.daemon.agents.test_claims import IDENTITY, REFUND, CountingRefund, refund_tool

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

# Far beyond anything the test waits for: a drive that needed it would show in virtual time.
POLL = 3600.0
# How long, in virtual time, a run may take to go on by itself.
BOUND = 60.0


# The most one jump of the clock moves it while the ticker runs.
TICK = 0.05


@pytest.fixture
def virtual_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.02)


async def ticking() -> None:
    """A deadline ``TICK`` ahead, always: what the clock jumps to while a thread works."""
    while True:
        await trio.sleep(TICK)


async def until(condition) -> None:
    while not condition():
        await trio.sleep(0.05)


def refund_graph():
    return graph_from_value(
        {
            "schema_version": 1,
            "nodes": [{"id": "refund", "kind": "tool", "tool": "refund", "input": REFUND}],
            "edges": [],
        }
    )


async def rests(runtime: Runtime, run_id: str, drivers: DriverSet, state: RunState) -> None:
    while drivers.driving(run_id) or (await runtime.reads.view(run_id)).state is not state:
        await trio.sleep(0.05)


def refund_completion(log):
    [done] = [e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED]
    return done


async def test_a_run_stopped_on_a_claim_in_flight_goes_on_when_the_holder_completes(
    store_url, virtual_clock, monkeypatch
) -> None:
    monkeypatch.setenv("SALVOR_CLAIM_WAIT_SECONDS", "1")
    refund = CountingRefund()
    refund.gate = trio.Event()
    async with open_store_access(store_url) as access:
        runtime = Runtime(access, ToolRegistry([refund.tool()]))
        graph = refund_graph()
        await runtime.definitions.register_graph(graph)
        holder = await runtime.starts.start_graph_run(graph, None)
        waiter = await runtime.starts.start_graph_run(graph, None)
        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticking)
                drivers = DriverSet(runtime, nursery, claim_poll_seconds=POLL)
                drivers.start(holder)
                await until(refund.entered.is_set)
                drivers.start(waiter)
                # It waited its bound and stopped: running, no driver, nothing of its call written.
                await until(lambda: drivers.claim_waits.waiting(waiter))
                assert not drivers.driving(waiter)
                assert (await runtime.reads.view(waiter)).state is RunState.RUNNING
                released = trio.current_time()
                refund.gate.set()
                await rests(runtime, waiter, drivers, RunState.COMPLETED)
                # Woken by the holder's own commit, not by the fallback poll.
                assert trio.current_time() - released < POLL
                assert len(drivers.claim_waits) == 0
                nursery.cancel_scope.cancel()
        assert (await runtime.reads.view(holder)).state is RunState.COMPLETED
        assert [(c.run_id, c.idempotency_key) for c in refund.calls] == [(holder, IDENTITY)]
        copied = refund_completion(await runtime.reads.log(waiter))
        performed = refund_completion(await runtime.reads.log(holder))
        assert copied.output == performed.output == {"refunded": 1250}
        assert copied.deduplicated_from["run_id"] == holder


async def test_a_holder_settled_from_another_process_is_found_by_the_fallback_poll(
    store_url, virtual_clock, monkeypatch
) -> None:
    monkeypatch.setenv("SALVOR_CLAIM_WAIT_SECONDS", "1")
    refund = CountingRefund()

    async def lost(tool_input, call):
        refund.calls.append(call)
        raise OutcomeUnknown("the payment API timed out")

    poll = 2.0
    async with (
        open_store_access(store_url) as access,
        open_store_access(store_url) as shell_access,
    ):
        runtime = Runtime(access, ToolRegistry([refund.tool()]))
        graph = refund_graph()
        await runtime.definitions.register_graph(graph)
        holder = await runtime.starts.start_graph_run(graph, None)
        # The holder's write is lost in flight: it parks with its claim open.
        lossy = Runtime(shell_access, ToolRegistry([refund_tool(lost, Effect.WRITE)]))
        assert (await lossy.drive(holder)).state is RunState.NEEDS_RECONCILIATION
        waiter = await runtime.starts.start_graph_run(graph, None)
        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticking)
                drivers = DriverSet(runtime, nursery, claim_poll_seconds=poll)
                drivers.start(waiter)
                await until(lambda: drivers.claim_waits.waiting(waiter))
                # A person resolves the write from a shell: another store access, whose commit
                # this daemon never sees.
                await lossy.control.resolve(holder, {"refunded": 1250}, {})
                # Only the fallback poll can find it (no commit of this access woke the wait):
                # without it the run never goes on and the bound fires. (How soon after the
                # resolve, in virtual time, is not asserted: a stalled thread moves the clock.)
                await rests(runtime, waiter, drivers, RunState.COMPLETED)
                nursery.cancel_scope.cancel()
        assert len(refund.calls) == 1
        copied = refund_completion(await runtime.reads.log(waiter))
        assert copied.output == {"refunded": 1250}
        assert copied.deduplicated_from["run_id"] == holder
