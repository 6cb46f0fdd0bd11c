"""What every route of a serving daemon shares (``ServerState``), from its configuration and its
services, and the build it reports."""

from __future__ import annotations

import subprocess
from pathlib import Path

import trio

from ..agents import Credentials
from ..api import ServerState, StreamSlots
from ..client_runs import StoredLeases
from ..metrics import DaemonMetrics
from ..recording import FreeSpaceFloor
from ..runs import DriverSet, EventHub, Runtime
from ..web import FailedTries, StoredSessions
from ._serve_config import ServeConfig

# Bound on the git commands of ``build_commit``, together: a hung git (a
# locked index, a network filesystem) delays the start by this much at most.
GIT_SECONDS = 5.0


async def build_commit() -> str | None:
    """The short git hash of the checkout this code runs from (``-dirty`` with local changes).

    None when it is not a checkout, git is missing or fails, or git takes
    longer than ``GIT_SECONDS``. git runs as a child process trio waits on,
    never on the trio thread.
    """
    root = Path(__file__).resolve().parents[2]
    if not await trio.Path(root / ".git").exists():
        return None

    async def git(*args: str) -> str | None:
        try:
            done = await trio.run_process(
                ["git", "-C", str(root), *args],
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        except OSError:
            return None
        return done.stdout.decode(errors="replace").strip() if done.returncode == 0 else None

    with trio.move_on_after(GIT_SECONDS):
        head = await git("rev-parse", "--short", "HEAD")
        dirty = await git("status", "--porcelain", "--untracked-files=no")
        if head and dirty is not None:
            return f"{head}-dirty" if dirty else head
    return None


async def server_state(
    config: ServeConfig,
    runtime: Runtime,
    drivers: DriverSet,
    hub: EventHub,
    executor,
    credentials: Credentials,
    locks,
    metrics: DaemonMetrics,
) -> ServerState:
    """What every route shares, from the daemon's configuration and its services."""
    return ServerState(
        runtime=runtime,
        drivers=drivers,
        hub=hub,
        auth_token=config.auth_token,
        failed_tries=FailedTries(limit=config.token_tries),
        commit=await build_commit(),
        stream_poll_seconds=config.stream_poll_seconds,
        heartbeat_seconds=config.heartbeat_seconds,
        detach_grace_seconds=config.detach_grace_seconds,
        body_timeout_seconds=config.body_timeout_seconds,
        allow_process_agents=config.allow_process_agents,
        # Issue 30, item 3: leases and login sessions live in the store, so a client or a person
        # may reach any node over it.
        leases=StoredLeases(runtime.access, config.lease_ttl),
        sessions=StoredSessions(runtime.access.store.sessions),
        model_executor=executor,
        client_tools=dict(config.client_tools),
        credentials=credentials,
        driven_elsewhere=locks.runs_held_elsewhere,
        metrics=metrics,
        worker=None if config.worker is None else config.worker.index,
        # Streaming bounds (issue 29).
        stream_buffer_bytes=config.stream_buffer_bytes,
        stream_slots=StreamSlots(config.max_streams_per_client),
        max_payload_bytes=config.quota.max_payload_bytes,
        floor=FreeSpaceFloor(config.store_url, config.min_free_bytes),
        # Run ownership (issue 30): ``driver_node`` and a peer's drives read from the store.
        this_node=lambda: runtime.access.driving.node.node_id,
        owners_of=runtime.access.store.owners.owners,
    )
