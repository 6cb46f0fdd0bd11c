"""A resume's 202 is answered once every node over the store reads the run as driven.

Two daemons over one store stand for two workers of one ``salvor serve`` (a client's requests
land on either). The run is a built-in one the CLI left inside its write (killed there after
the refund went out); its write declares a probe, so a resume starts a drive that probes it.
Until that drive claims the run in the store, another node reads the run as resting at the
write with no driver, and a stream there ends at needs_reconciliation: the walkthrough's
``resume`` then ``watch`` saw exactly that once under load.
"""

from __future__ import annotations

import trio
from salvor.daemon.tools._demo import EFFECTS_ENV

from tests.support.api import killed_in_a_write


async def until_let_go(server, run: str) -> None:
    """Until the killed CLI's run lock is gone (PostgreSQL's backend drops a dead session's
    advisory lock a moment after the process died)."""
    with trio.fail_after(30):
        while run in await trio.to_thread.run_sync(server.state.driven_elsewhere, [run]):
            await trio.sleep(0.05)


async def test_after_a_resume_another_node_reads_the_run_driven_or_moved_on(
    server_factory, store_url, tmp_path, monkeypatch
) -> None:
    # One ledger for the CLI and both daemons, whatever the store: the probe finds the refund.
    monkeypatch.setenv(EFFECTS_ENV, str(tmp_path / "effects.jsonl"))
    here, there = await server_factory(), await server_factory()
    for attempt in range(3):
        run = await killed_in_a_write(store_url, tmp_path, f"INV-41-{attempt}")
        await until_let_go(here, run)
        answer = await here.client.post(f"/v1/runs/{run}/resume")
        # 200 when a takeover sweep had already driven the run to its end (a CLI's run is
        # anyone's to recover once its process died).
        assert answer.status_code in (200, 202), answer.text
        seen = (await there.client.get(f"/v1/runs/{run}")).json()
        assert seen["status"]["state"] != "needs_reconciliation" or seen["driver"] == "attached", (
            seen
        )
        assert (await there.wait_resting(run))["status"]["state"] == "completed"
