"""Drive-token leases kept in the store (``StoredLeases``): the in-process registry's rules on the
database's clock, the token kept only as a digest, and a driving call that writes at most once
per tenth of the TTL."""

from __future__ import annotations

import pytest
import trio
from salvor.daemon.client_runs import StoredLeases
from salvor.daemon.recording import open_store_access
from salvor.daemon.web._errors import OperationRefused
from salvor.store import normalize_store_url
from sqlalchemy import create_engine, text

from tests.support.backends import BOTH

STORE_BACKENDS = BOTH
RUN = "6f3c2b1a-0000-4000-8000-000000000001"


async def refused(fn, *args, **kwargs) -> OperationRefused:
    with pytest.raises(OperationRefused) as caught:
        await fn(*args, **kwargs)
    return caught.value


def stored_rows(store_url: str) -> list[tuple]:
    engine = create_engine(normalize_store_url(store_url))
    try:
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(text("SELECT * FROM client_leases"))]
    finally:
        engine.dispose()


async def test_the_rules_of_a_lease_hold_in_the_store(store_url) -> None:
    async with open_store_access(store_url) as access:
        leases = StoredLeases(access, ttl=60)
        token = await leases.open(RUN, None, record_prompts=True)
        assert token.startswith("dt_") and await leases.holds(RUN) and await leases.opened(RUN)
        assert await leases.record_prompts(RUN) is True
        # The token is a secret: the store keeps a digest of it, never the token.
        ((row),) = stored_rows(store_url)
        assert token not in repr(row) and len(row[1]) == 64
        error = await refused(leases.open, RUN, "dt_someone-else")
        assert (error.code, error.status) == ("lease_held", 409)
        assert 59 <= error.details["lapses_in_seconds"] <= 60
        assert await leases.open(RUN, token, record_prompts=False) == token
        assert await leases.record_prompts(RUN) is True  # kept from the open
        assert (await refused(leases.check, RUN, None)).code == "missing_drive_token"
        assert (await refused(leases.check, RUN, "dt_x")).code == "invalid_drive_token"
        assert await leases.heartbeat(RUN, token) == 60
        assert (await refused(leases.release, RUN, None)).code == "invalid_drive_token"
        assert await leases.release(RUN, token) is True
        assert await leases.release(RUN, token) is False
        assert not await leases.holds(RUN) and await leases.holding([RUN]) == set()
        fresh = await leases.open(RUN, None)
        assert fresh != token
        assert await leases.open(RUN, None, terminal=True) != fresh  # a finished run opens at once
        await leases.drop(RUN)
        assert not await leases.holds(RUN)


async def test_a_driving_call_refreshes_the_store_once_a_tenth_of_the_ttl_has_passed(
    store_url,
) -> None:
    async with open_store_access(store_url) as access:
        leases = StoredLeases(access, ttl=20.0)
        token = await leases.open(RUN, None)
        ((_, _, _, _, opened_until),) = stored_rows(store_url)
        await leases.check(RUN, token)  # within the first tenth (2 s): nothing is written
        assert stored_rows(store_url)[0][4] == opened_until
        with trio.fail_after(30):
            while (await access.read(access.store.client_leases.current, RUN)).seconds_left > 17.9:
                await trio.sleep(0.05)
        await leases.check(RUN, token)
        assert stored_rows(store_url)[0][4] > opened_until


async def test_a_quiet_lease_lapses_on_the_stores_clock(store_url) -> None:
    async with open_store_access(store_url) as access:
        leases = StoredLeases(access, ttl=1.0)
        token = await leases.open(RUN, None)
        with trio.fail_after(30):
            while await leases.holds(RUN):
                await trio.sleep(0.1)
        assert await leases.open(RUN, None) != token
        assert (await refused(leases.check, RUN, token)).code == "invalid_drive_token"
