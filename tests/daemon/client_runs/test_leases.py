"""Drive-token leases on the trio clock (``autojump_clock`` moves time)."""

from __future__ import annotations

import pytest
import trio
from salvor.daemon.client_runs._leases import LeaseRegistry, lease_ttl
from salvor.daemon.web._errors import OperationRefused

RUN = "6f3c2b1a-0000-4000-8000-000000000001"


async def refused(fn, *args, **kwargs) -> OperationRefused:
    with pytest.raises(OperationRefused) as caught:
        await fn(*args, **kwargs)
    return caught.value


async def test_a_lease_holds_while_its_driver_is_alive_and_lapses_after_the_ttl(
    autojump_clock,
) -> None:
    leases = LeaseRegistry(ttl=60)
    token = await leases.open(RUN, None)
    assert token.startswith("dt_") and await leases.holds(RUN)
    await trio.sleep(59)
    error = await refused(leases.open, RUN, None)
    assert (error.code, error.status, error.details) == (
        "lease_held",
        409,
        {"lapses_in_seconds": 1},
    )
    await leases.check(RUN, token)  # a driving call refreshes the hold
    await trio.sleep(59)
    assert await leases.holds(RUN)
    assert (await refused(leases.open, RUN, None)).details == {"lapses_in_seconds": 1}
    assert await leases.heartbeat(RUN, token) == 60
    await trio.sleep(60.5)
    assert not await leases.holds(RUN)
    fresh = await leases.open(RUN, None)
    assert fresh != token
    error = await refused(leases.check, RUN, token)
    assert (error.code, error.status) == ("invalid_drive_token", 403)


async def test_the_holder_reopens_under_its_own_token_and_others_are_refused(
    autojump_clock,
) -> None:
    leases = LeaseRegistry(ttl=10)
    token = await leases.open(RUN, None)
    assert await leases.open(RUN, token) == token
    assert (await refused(leases.open, RUN, "dt_someone-else")).code == "lease_held"
    assert (await refused(leases.check, RUN, None)).code == "missing_drive_token"
    assert (await refused(leases.check, RUN, "dt_someone-else")).status == 403
    # A terminal run is never held: it opens at once, under a new token.
    assert await leases.open(RUN, None, terminal=True) != token


async def test_release_is_idempotent_and_only_for_the_holder(autojump_clock) -> None:
    leases = LeaseRegistry(ttl=10)
    token = await leases.open(RUN, None)
    assert (await refused(leases.release, RUN, None)).code == "invalid_drive_token"
    assert (await refused(leases.release, RUN, "dt_other")).code == "invalid_drive_token"
    assert await leases.release(RUN, token) is True
    assert await leases.release(RUN, token) is False
    assert await leases.release("never-opened", None) is False
    # The run leaves the registry with its lease: from then on its log says whose it is.
    assert not await leases.opened(RUN) and not await leases.holds(RUN)
    await leases.open(RUN, None)
    assert await leases.opened(RUN)
    assert await leases.holding([RUN, "never-opened"]) == {RUN}
    await leases.drop(RUN)
    assert not await leases.holds(RUN) and not await leases.opened(RUN)


async def test_record_prompts_is_said_at_the_open_and_kept_by_the_holders_reopen(
    autojump_clock,
) -> None:
    leases = LeaseRegistry(ttl=10)
    assert await leases.record_prompts(RUN) is False
    token = await leases.open(RUN, None, record_prompts=True)
    assert await leases.open(RUN, token, record_prompts=False) == token
    assert await leases.record_prompts(RUN) is True
    await trio.sleep(11)
    assert await leases.record_prompts(RUN) is False  # nothing is said for a lapsed hold
    await leases.open(RUN, None)
    assert await leases.record_prompts(RUN) is False


async def test_lapsed_leases_nobody_touches_again_are_swept(autojump_clock) -> None:
    from salvor.daemon.client_runs import _leases

    leases = LeaseRegistry(ttl=5)
    runs = [f"6f3c2b1a-0000-4000-8000-{n:012d}" for n in range(3 * _leases._SWEEP_FLOOR)]
    for run_id in runs[: _leases._SWEEP_FLOOR]:
        await leases.open(run_id, None)
    await trio.sleep(6)  # every one of them lapses, untouched
    for run_id in runs[_leases._SWEEP_FLOOR :]:
        await leases.open(run_id, None)
    # Only the live holds are kept, however many runs came and went.
    assert len(leases._leases) <= 2 * _leases._SWEEP_FLOOR and len(leases._opened) == len(
        leases._leases
    )
    assert not any([await leases.opened(run_id) for run_id in runs[: _leases._SWEEP_FLOOR]])
    assert all([await leases.holds(run_id) for run_id in runs[_leases._SWEEP_FLOOR :]])


def test_the_ttl_comes_from_the_environment() -> None:
    assert lease_ttl({}) == 60
    assert lease_ttl({"SALVOR_CLIENT_LEASE_TTL_SECS": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "nan", "inf"):
        with pytest.raises(ValueError, match="SALVOR_CLIENT_LEASE_TTL_SECS"):
            lease_ttl({"SALVOR_CLIENT_LEASE_TTL_SECS": bad})
