"""Agent processes a killed salvor left behind, found by their mark and killed.

A process agent runs in a process group of its own (so a timeout can kill
the whole group), so nothing in the kernel tears that group down when the
daemon is SIGKILLed. The tether each child is started through
(``_spawn``/``_tether``) kills the group a moment after its salvor dies;
this sweep is the second line, for what the tether cannot cover (no pidfds,
a tether killed itself, an agent started by an older salvor). Left alone,
such an orphan keeps calling a proxy that is gone, or worse, keeps acting
on the world while the restarted daemon starts a second copy of the same
run.

So every agent process carries two marks in its environment:
``SALVOR_DAEMON``, a short hash of the store URL (next to ``SALVOR_RUN_ID``,
which names its run), and ``SALVOR_OWNER``, the pid, kernel start time and
pid namespace of the salvor process that started it. Children inherit the
environment, so they carry them too. Before ``salvor serve`` recovers
anything, and before ``salvor resume RUN`` drives a run, the live processes
are scanned (``/proc/*/environ``, Linux only) and the process group of each
one carrying the store's mark is SIGKILLed only when its owner is provably
dead: the owner ran in this sweep's pid namespace (so its pid means the same
here) and no process with that pid and start instant lives now (a zombie is
dead; a recycled pid starts later). Several daemons share a store and a
machine (``--workers``, or nodes side by side), and a starting one must never
kill a live sibling's children, so anything short of that proof spares the
process: an owner alive, an owner in another pid namespace (a container whose
pids this sweep cannot read), or no owner mark at all (nothing says whose it
is; it is named in a warning, for a person to judge).

Why the hash of the store URL: two daemons over different stores never
touch each other's agents. Why PID reuse is harmless for the agent's pid:
the marks are read from the live process's own environment at the time of
the sweep, so a recycled pid that now belongs to an unrelated process does
not match. (The only gap is the instant between reading a process's
environment and signalling its group.) A process we cannot read (another
user's) is skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import trio

log = logging.getLogger("salvor.orphans")

MARK_VAR = "SALVOR_DAEMON"
RUN_VAR = "SALVOR_RUN_ID"
OWNER_VAR = "SALVOR_OWNER"
_PROC = Path("/proc")


def pid_start(pid: int) -> str | None:
    """When process ``pid`` started (field 22 of ``/proc/<pid>/stat``, clock ticks since boot);
    None when no live process has that pid (gone, or a zombie). With the pid it names one process
    for the machine's uptime (a pid alone is reused)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The fields after the parenthesised command name (which may hold spaces): state is the
    # third field, starttime the twenty-second.
    rest = stat.rpartition(")")[2].split()
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    return rest[19]


def _pid_namespace() -> str:
    """This process's pid namespace (``pid:[inode]``), "" where it cannot be read."""
    try:
        return os.readlink(_PROC / "self" / "ns" / "pid")
    except OSError:
        return ""


def owner_mark() -> str:
    """``SALVOR_OWNER``'s value for agents this process starts:
    ``<pid>:<start time>:<pid namespace>``."""
    pid = os.getpid()
    return f"{pid}:{pid_start(pid) or '0'}:{_pid_namespace()}"


def owner_dead(mark: str) -> bool:
    """Whether the salvor process an owner mark names is provably gone: it ran in this pid
    namespace, and no process with its pid and start instant lives (a recycled pid started
    later). An owner mark that does not parse proves nothing."""
    pid, _, rest = mark.partition(":")
    started, _, namespace = rest.partition(":")
    if not pid.isdigit() or not started.isdigit():
        return False
    # A mark without a namespace is from a salvor that wrote none: it ran beside us, as before.
    if namespace and namespace != _pid_namespace():
        return False
    return pid_start(int(pid)) != started


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (our children run in groups of their
    own); gone already is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def store_fingerprint(store_url: str) -> str:
    """The mark's value for agents of the store at ``store_url`` (as the store displays it)."""
    return hashlib.sha256(store_url.encode("utf-8")).hexdigest()[:16]


def _environ(pid: int) -> Mapping[str, str] | None:
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, another user's, or a kernel thread
        return None
    env = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def marked_processes(fingerprint: str, run_id: str | None = None) -> Iterator[tuple[int, str]]:
    """``(pid, run_id)`` of each live process carrying ``fingerprint`` (and that run, if
    given) whose owner is provably gone. One naming no owner is logged and passed over."""
    me = os.getpid()
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        env = _environ(int(entry.name))
        if env is None or env.get(MARK_VAR) != fingerprint:
            continue
        run = env.get(RUN_VAR, "")
        if run_id is not None and run != run_id:
            continue
        owner = env.get(OWNER_VAR)
        if owner is None:
            log.warning(
                "process %s carries this store's mark (run %s) but names no salvor that started "
                "it, so it is left running: kill it by hand if no salvor over this store owns it",
                entry.name,
                run or "<unknown>",
            )
            continue
        if owner_dead(owner):
            yield int(entry.name), run


def kill_orphans(fingerprint: str, run_id: str | None = None) -> dict[str, list[int]]:
    """SIGKILL the process group of every marked process; returns the pids seen, by run.

    Blocking (it reads /proc): call it off the trio thread.
    """
    if not sys.platform.startswith("linux") or not _PROC.is_dir():
        log.debug("no /proc on this platform: orphaned agent processes are not looked for")
        return {}
    own_group = os.getpgrp()
    killed: dict[str, list[int]] = {}
    groups: set[int] = set()
    for pid, run in marked_processes(fingerprint, run_id):
        try:
            group = os.getpgid(pid)
            if group == own_group:
                # Never our own group: an agent always gets a session of its
                # own, so a marked process here is not one we started.
                os.kill(pid, signal.SIGKILL)
            elif group not in groups:
                os.killpg(group, signal.SIGKILL)
                groups.add(group)
        except (ProcessLookupError, PermissionError):
            continue
        killed.setdefault(run, []).append(pid)
    return killed


async def sweep_orphans(store_url: str, run_id: str | None = None) -> dict[str, list[int]]:
    """Kill what an earlier salvor left running for this store (for one run, if
    given); log one line per run."""
    killed = await trio.to_thread.run_sync(kill_orphans, store_fingerprint(store_url), run_id)
    for run, pids in sorted(killed.items()):
        log.warning(
            "run %s: killed agent process %s (and its process group), "
            "left running by a salvor that died",
            run or "<unknown>",
            ", ".join(map(str, sorted(pids))),
        )
    return killed
