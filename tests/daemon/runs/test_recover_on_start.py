"""Recovery on start: one driver per interrupted run, each loading its own agent.

Recovery hands the interrupted runs to the driving set without reading any
of them (bench_recover: 1,000 interrupted runs took 3.4 s to READY when it
read each first); the drivers load their own, inside the set's bounds.
A run whose agent the store does not hold is left exactly as it was.
"""

from __future__ import annotations

import trio
from salvor.daemon.api._app import ServerState
from salvor.daemon.runs._drivers import DriverSet
from salvor.daemon.runs._event_hub import EventHub
from salvor.daemon.serve._run_sweeps import interrupted_runs, recover
from salvor.protocol import EMPTY_VIEW, ModelCallRequested, RunStarted, RunState

from tests.support.scripted_provider import text_reply


async def test_every_interrupted_run_is_started_and_drives_from_its_own_log(
    runtime, providers, make_agent
):
    provider = providers([text_reply("done")])
    agent = make_agent(provider)
    recovered = await runtime.starts.start_run(agent, {"task": "one"})
    orphan = "00000000-0000-4000-8000-000000000001"
    await runtime.access.append(
        orphan,
        [
            RunStarted(agent_def_hash="sha256:" + "f" * 64, input=None),
            ModelCallRequested(request_hash="sha256:" + "0" * 64),
        ],
        EMPTY_VIEW,
    )
    before = await runtime.reads.log(orphan)

    async with trio.open_nursery() as nursery:
        drivers = DriverSet(runtime, nursery)
        state = ServerState(runtime=runtime, drivers=drivers, hub=EventHub())
        assert recover(state, await interrupted_runs(state)) == 2
        assert drivers.driving(recovered) and drivers.driving(orphan)

    assert (await runtime.reads.view(recovered)).state is RunState.COMPLETED
    assert provider.call_count == 1
    # No agent for it here: the driver gave up and recorded nothing.
    assert await runtime.reads.log(orphan) == before
    assert not drivers.driving(orphan)
