"""The store and run locks (``salvor.store.open_locks``) for trio code: taken
and released off the trio thread.

Who takes what: ``salvor serve`` the store locks as a daemon (shared with other
daemons, refusing command-line drivers) before it sweeps, recovers or binds anything;
``salvor resume`` and ``wake`` as a command-line driver (shared with other command
lines, refusing daemons); every command line drive the run lock of the run it drives
(``salvor run`` and ``rerun`` before the run exists), so a daemon starting
beside it does not recover that run a second time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from salvor.store import RunHint, StoreLocks, StoreOwned, open_locks

SERVE = "serve"


@asynccontextmanager
async def own_store(
    url: str, command: str, *, share: bool | None, run_hint: RunHint = ""
) -> AsyncIterator[StoreLocks]:
    """Hold this process's locks on the store at ``url`` for the block.

    ``share`` False takes the store locks as a daemon (``serve``), True as a
    command-line driver, None not at all (the run locks alone). ``run_hint`` ends a
    shared taker's refusal: what to do instead while the daemon serves.

    Raises:
        StoreOwned: another live salvor holds the store lock in a conflicting
            mode; nothing was taken, nothing in the store touched.
        StoreUnavailable: the lock file or the database cannot be reached.
    """
    locks = await trio.to_thread.run_sync(open_locks, url, command)
    try:
        if share is not None:
            await trio.to_thread.run_sync(locks.claim, command if not share else "", run_hint)
        yield locks
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(locks.close)


@asynccontextmanager
async def driving_run(locks: StoreLocks, run_id: str) -> AsyncIterator[None]:
    """Hold ``run_id``'s run lock for the block.

    Raises:
        StoreOwned: another live salvor drives that run; nothing was taken.
    """
    holder = await trio.to_thread.run_sync(locks.hold_run, run_id)
    if holder is not None:
        raise StoreOwned(
            f"run {run_id} is being driven by {holder.describe()}; let it finish, or stop it first"
        )
    try:
        yield
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(locks.release_run, run_id)
