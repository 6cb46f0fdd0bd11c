"""Two daemons over one outbox: while both deliver, each row is sent by one of them at a time
(issue 30, item 3: a due row is claimed by one deliverer).

Delivery is at least once (``notify._deliverer``): a row is sent again only after an attempt
failed, here a webhook answer the receiver held past the delivery timeout (a loaded machine
starts the second deliverer late). So a row is sent at most once per failed attempt it counts,
plus the one that was accepted: never by both deliverers at once.
"""

from __future__ import annotations

from collections import Counter

import trio
from salvor.daemon.notify import Deliverer, NotifyConfig
from salvor.daemon.recording import open_store_access
from salvor.protocol import EMPTY_VIEW, RunFailed, RunStarted
from salvor.store import AppendRequest

from tests.support.backends import BOTH
from tests.support.webhook_receiver import WebhookReceiver

STORE_BACKENDS = BOTH
ROWS = 120  # more than one claimed batch, so both deliverers take some


async def test_two_deliverers_over_one_outbox_send_each_row_once_per_attempt(store_url) -> None:
    async with (
        open_store_access(store_url, notifications=True) as one,
        open_store_access(store_url, notifications=True) as other,
    ):
        failed = [
            AppendRequest(
                run_id=f"run-{n:03d}",
                events=[RunStarted(agent_def_hash="sha256:a", input=n), RunFailed(error="no")],
                view=EMPTY_VIEW,
            )
            for n in range(ROWS)
        ]
        await trio.to_thread.run_sync(one.store.append_batch, failed)
        with WebhookReceiver([200]) as receiver:
            # Answers wait until both deliverers are mid-delivery: neither can have marked a row
            # delivered when the other looks at the outbox.
            receiver.hold()
            async with trio.open_nursery() as nursery:
                for access, node in ((one, "node-one"), (other, "node-other")):
                    deliverer = Deliverer(access, NotifyConfig(webhook=receiver.url), node=node)
                    await nursery.start(deliverer.serve)
                assert await trio.to_thread.run_sync(receiver.wait_for, 16, 30.0)
                receiver.release()
                with trio.fail_after(60):
                    while any(row.delivered_at is None for row in await entries(one)):
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
        sent = Counter(
            (r.json()["run"], r.json()["seq"], r.json()["kind"]) for r in receiver.requests
        )
        rows = await entries(one)
        # At most once per attempt: a timed-out attempt counts even when the receiver never
        # read it (the deliverer gave up while its connection still waited).
        attempts = {(row.run_id, row.seq, row.kind): row.attempts + 1 for row in rows}
        assert len(sent) == ROWS == len(attempts), (len(sent), len(attempts))
        assert all(sent[key] <= attempts[key] for key in sent), [
            (key, sent[key], attempts[key]) for key in sent if sent[key] > attempts[key]
        ]
        assert {row.claimed_by for row in rows} == {"node-one", "node-other"}


async def entries(access):
    return await access.read(access.store.outbox.entries)


async def test_a_deliverer_that_stops_lets_its_claims_go_to_the_other(store_url) -> None:
    async with (
        open_store_access(store_url, notifications=True) as one,
        open_store_access(store_url, notifications=True) as other,
    ):
        failed = [
            AppendRequest(
                run_id=f"run-{n:03d}",
                events=[RunStarted(agent_def_hash="sha256:a", input=n), RunFailed(error="no")],
                view=EMPTY_VIEW,
            )
            for n in range(4)
        ]
        await trio.to_thread.run_sync(one.store.append_batch, failed)
        with WebhookReceiver([200]) as receiver:
            receiver.hold()
            async with trio.open_nursery() as stopping:
                leaving = Deliverer(one, NotifyConfig(webhook=receiver.url), node="node-leaving")
                await stopping.start(leaving.serve)
                assert await trio.to_thread.run_sync(receiver.wait_for, 4, 30.0)
                assert {row.claimed_by for row in await entries(one)} == {"node-leaving"}
                stopping.cancel_scope.cancel()  # a graceful stop, mid-delivery
            # Nothing waits for the claims to run out: the rows are anyone's again.
            assert all(row.claimed_by is None for row in await entries(one))
            receiver.release()
            staying = Deliverer(other, NotifyConfig(webhook=receiver.url), node="node-staying")
            assert await staying.deliver_due() == 4
            await staying.aclose()
        assert {row.claimed_by for row in await entries(one)} == {"node-staying"}
