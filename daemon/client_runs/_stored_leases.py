"""Drive-token leases kept in the store (``store.client_leases``), so a client that opened a run
through one node may drive it through any node over the same store.

The store keeps each lease's token digest and its expiry on the database's clock; this side
makes the tokens, digests what a caller presents and compares digests in constant time. The
TTL is the in-process registry's, with one difference that keeps a busy run cheap: a driving
call refreshes the lease in the store only once a tenth of the TTL has passed since it was last
refreshed (one read per call, one write at most per TTL/10 per run), so a lease lapses between
0.9 and 1 TTL after its last driving call. An open and a heartbeat always refresh.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection

import trio
from salvor.store import ClientLease

from ..recording import StoreAccess
from ._leases import (
    DEFAULT_TTL_SECONDS,
    invalid_token,
    lease_held,
    missing_token,
    new_token,
    whole_seconds,
)

# A driving call leaves the store alone while the lease has more than this share of its TTL left.
REFRESH_SHARE = 0.9


def token_digest(token: str) -> str:
    """What the store keeps of a drive token: its SHA-256, in hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def _matches(lease: ClientLease, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(
        token_digest(presented), lease.token_digest
    )


class StoredLeases:
    """The holds on client-driven runs, in the store (a ``DriveLeases``).

    Error handling: every method raises ``StoreUnavailable`` when the store cannot be read or
    written; a lease is then as it was.
    """

    def __init__(self, access: StoreAccess, ttl: float = DEFAULT_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._access = access
        self._rows = access.store.client_leases
        # When this node last swept lapsed leases nobody re-opened (trio clock).
        self._swept_at = -float("inf")
        # run id -> when this node last saw its lease stand (trio clock): ``seen_holding``.
        self._seen: dict[str, float] = {}

    async def _current(self, run_id: str) -> ClientLease | None:
        lease = await self._access.read(self._rows.current, run_id)
        if lease is None:
            self._seen.pop(run_id, None)
        else:
            self._seen[run_id] = trio.current_time()
        return lease

    async def holding(self, run_ids: Collection[str]) -> set[str]:
        if not run_ids:
            return set()
        held = await self._access.read(self._rows.holding, run_ids)
        now = trio.current_time()
        for run_id in held:
            self._seen[run_id] = now
        return held

    def seen_holding(self, run_id: str) -> bool:
        seen = self._seen.get(run_id)
        if seen is None:
            return False
        if trio.current_time() - seen < (1 - REFRESH_SHARE) * self.ttl:
            return True
        del self._seen[run_id]
        return False

    async def _write(self, fn, *args, **kwargs):
        # Not on a reader thread: a write waiting for the database's lock must not hold up reads.
        return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def opened(self, run_id: str) -> bool:
        return await self.holds(run_id)

    async def holds(self, run_id: str) -> bool:
        return await self._current(run_id) is not None

    async def record_prompts(self, run_id: str) -> bool:
        lease = await self._current(run_id)
        return lease is not None and lease.record_prompts

    async def open(
        self,
        run_id: str,
        presented: str | None,
        *,
        terminal: bool = False,
        record_prompts: bool = False,
    ) -> str:
        lease = await self._current(run_id)
        if lease is not None and not terminal:
            if not _matches(lease, presented):
                raise lease_held(run_id, lease.seconds_left)
            if await self._write(self._rows.refresh, run_id, lease.token_digest, ttl=self.ttl):
                return presented
            # It lapsed in between: the holder takes the run afresh, like anyone.
        await self._sweep_now_and_then()
        token = new_token()
        if await self._write(
            self._rows.take,
            run_id,
            token_digest(token),
            ttl=self.ttl,
            record_prompts=record_prompts,
            over_current=terminal,
        ):
            self._seen[run_id] = trio.current_time()
            return token
        # Another node's open took it between the read and the take.
        lease = await self._current(run_id)
        raise lease_held(run_id, self.ttl if lease is None else lease.seconds_left)

    async def check(self, run_id: str, presented: str | None) -> None:
        await self._admit(run_id, presented, refresh_always=False)

    async def heartbeat(self, run_id: str, presented: str | None) -> int:
        await self._admit(run_id, presented, refresh_always=True)
        return whole_seconds(self.ttl)

    async def _admit(self, run_id: str, presented: str | None, *, refresh_always: bool) -> None:
        if presented is None:
            raise missing_token()
        lease = await self._current(run_id)
        if lease is None or not _matches(lease, presented):
            raise invalid_token(run_id)
        stale = refresh_always or lease.seconds_left < REFRESH_SHARE * self.ttl
        if stale and not await self._write(
            self._rows.refresh, run_id, lease.token_digest, ttl=self.ttl
        ):
            raise invalid_token(run_id)

    async def release(self, run_id: str, presented: str | None) -> bool:
        lease = await self._current(run_id)
        if lease is None:
            return False
        if not _matches(lease, presented):
            raise invalid_token(run_id)
        self._seen.pop(run_id, None)
        return await self._write(self._rows.end, run_id, lease.token_digest)

    async def drop(self, run_id: str) -> None:
        self._seen.pop(run_id, None)
        await self._write(self._rows.end, run_id)

    async def _sweep_now_and_then(self) -> None:
        """Remove lapsed leases nobody re-opened, at most once per TTL from this node: the
        table stays as large as the runs driven now."""
        now = trio.current_time()
        if now - self._swept_at < self.ttl:
            return
        self._swept_at = now
        # This node's memory of leases it saw goes the same way.
        horizon = (1 - REFRESH_SHARE) * self.ttl
        self._seen = {r: at for r, at in self._seen.items() if now - at < horizon}
        await self._write(self._rows.sweep)
