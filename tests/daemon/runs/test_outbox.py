"""A ``/v1/ws`` connection's outbox is bounded in bytes: the hub's offers close it (1013) once
a message does not fit, the catch-up's puts wait for room, and one message always fits an empty
outbox whatever its size."""

from __future__ import annotations

import trio
from salvor.daemon.runs import Outbox


async def test_offers_close_past_the_bytes_and_puts_wait_for_room() -> None:
    outbox = Outbox(100)
    assert outbox.offer("a" * 60) and outbox.offer("b" * 40)
    # Count does not matter, bytes do: one byte more does not fit.
    put_done = trio.Event()

    async def put() -> None:
        await outbox.put("c" * 30)
        put_done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(put)
        await trio.testing.wait_all_tasks_blocked()
        assert not put_done.is_set()
        assert await outbox.get() == "a" * 60
        await trio.testing.wait_all_tasks_blocked()
        assert put_done.is_set()
    assert await outbox.get() == "b" * 40
    assert await outbox.get() == "c" * 30
    # Empty: a message larger than the whole budget is still taken.
    assert outbox.offer("d" * 500)
    assert not outbox.offer("e")
    assert outbox.close_code == 1013
    assert "outgoing buffer full (500 bytes unsent)" in outbox.close_reason
    assert len(outbox.close_reason.encode()) <= 123
    assert await outbox.get() is None
