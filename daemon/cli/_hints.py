"""The next step a command line sentence names, as one that works where the reader is.

``salvor resume`` and ``salvor wake`` drive runs a daemon may be driving, so beside a live
``salvor serve`` over the same store they are refused (the daemons drive its runs). A hint printed
then names the request to that daemon instead, at the address it listens on; with no daemon
serving the store, it names the ``salvor`` command.
"""

from __future__ import annotations

import contextlib
import shlex

import trio
from salvor.store import StoreError, StoreLocks, open_locks

# A daemon serves the store, but its address is not known yet (it is still starting).
UNKNOWN_ADDRESS = ""


async def serving_daemon(url: str, locks: StoreLocks | None) -> str | None:
    """Where the daemon serving the store at ``url`` listens (``UNKNOWN_ADDRESS`` while it
    starts), or None when no daemon serves it. ``locks``: this process's own, when it holds
    some; else a handle is opened and closed for the question. Takes no lock."""

    def ask() -> str | None:
        if locks is not None:
            holder = locks.serving()
        else:
            with contextlib.closing(open_locks(url, "")) as probe:
                holder = probe.serving()
        if holder is None:
            return None
        listen = holder.listen or ""
        return daemon_address(listen)

    try:
        return await trio.to_thread.run_sync(ask)
    except StoreError:
        return None  # a hint is not worth a refusal: the salvor command it names says why


def daemon_address(listen: str) -> str:
    """A daemon's announced address (an ``http://`` URL or ``unix:PATH``) as a hint names it;
    ``UNKNOWN_ADDRESS`` while it starts."""
    if listen.startswith(("http://", "https://", "unix:")):
        return listen.rstrip("/")
    return UNKNOWN_ADDRESS


def _curl_target(daemon: str, path: str) -> str:
    """What ``curl`` is given to reach ``path`` on ``daemon``: a Unix socket is named with
    ``--unix-socket`` (curl then sends ``Host: localhost``)."""
    if daemon.startswith("unix:"):
        return f"--unix-socket {shlex.quote(daemon.removeprefix('unix:'))} http://localhost{path}"
    return f"{daemon}{path}"


def resume_hint(run_id: str, daemon: str | None, run_input: str | None = None) -> str:
    """How to resume ``run_id``, with ``run_input`` (JSON text, or ``JSON`` for "a value")."""
    if daemon is None:
        flag = ""
        if run_input is not None:
            flag = " --input " + (run_input if run_input == "JSON" else shlex.quote(run_input))
        return f"`salvor resume {run_id}{flag}`"
    body = "" if run_input is None else '{"input": ' + run_input + "}"
    if daemon == UNKNOWN_ADDRESS:
        with_body = f" with {body}" if body else ""
        return f"POST /v1/runs/{run_id}/resume{with_body} to the daemon serving this store"
    target = _curl_target(daemon, f"/v1/runs/{run_id}/resume")
    if not body:
        return f"`curl -s -X POST {target}`"
    return f"`curl -s {target} -H 'Content-Type: application/json' -d {shlex.quote(body)}`"


def wake_hint(run_id: str, daemon: str | None) -> str:
    """What continues a sleeping ``run_id`` once its instant has passed."""
    if daemon is None:
        return "`salvor wake` continues it once that passes"
    return (
        "the daemon serving this store wakes it once that passes (its wake sweeper), or "
        f"{resume_hint(run_id, daemon)} does then"
    )
