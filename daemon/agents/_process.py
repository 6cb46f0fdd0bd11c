"""Driving a process agent: a local command whose model calls cross the loopback proxy.

A drive starts the agent's command in a process group of its own, tied to
the daemon's life (``_spawn``), with an allow-listed environment
(``_child_env``), its model base URLs pointed at this run's capability path on the proxy and its
task in ``SALVOR_PROMPT``/``SALVOR_INPUT``, then waits for it to exit (within
its timeout). The proxy records every call; after a crash the next drive
starts the process again with the same task and the proxy answers the
recorded prefix from the log, so nothing completed is paid for again.

The task also reaches the program as an argument where ``command`` has a
``{prompt}`` element (``agent_command``): one argv element, never through a
shell, for a CLI such as ``llm`` that takes its prompt there.

Every process run is offered the ``salvor`` MCP server (the flow tools,
``proxies._flow_server``) beside its declared servers, unless its definition says
``salvor_mcp = false``.

A run an MCP tool parked (``_meta.salvor``, see ``_mcp_record``; the ``salvor``
server's ``ask_user`` parks it the same way) has its process stopped once the
wait is recorded, and holds nothing while it waits; so has one whose subagent's
child rests short of a result (the call's intent stays open, and the run is
driven again when the child ends).
A drive of a suspended run starts nothing; one of a sleeping run starts
nothing before its ``wake_at``, and after it records the wake first. Either
way the process then starts from the top of its log, as after a crash.

What the process starts with is ``_process_environment``'s; how its exit ends the run,
``_process_outcome``'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import trio
from salvor.protocol import (
    CodedError,
    Envelope,
    Pending,
    RunFailed,
    RunState,
    RunView,
    attached_tools,
)

from ..files import FileTools, file_tools
from ..flows import FlowHost, tree_tools
from ..mcp import McpServerSpec, open_connections
from ..processes import (
    MARK_VAR,
    OWNER_VAR,
    RUN_VAR,
    kill_group,
    open_tied_process,
    owner_mark,
    store_fingerprint,
)
from ..proxies import (
    FlowServer,
    McpLane,
    ModelProxy,
    ProxySession,
    open_lanes,
    open_model_proxy,
    probes_lane_write,
    recorded_calls,
    resolve_upstream,
    salvor_server,
    self_attached,
)
from ..recording import CallInFlight, DriveInterrupted, RunContext, StoreAccess, utc_now
from ..skills import Skill, SkillLibrary
from ..tools import Workspace
from ._agent_definition import AgentDefinition
from ._attachments import attachments_before
from ._process_attachments import attached_lane_probe, offer_attached_servers
from ._process_environment import agent_command, agent_environment, checked_task, standin_relays
from ._process_outcome import settle_process
from ._skill_calls import live_skills

logger = logging.getLogger("salvor.process")
STDERR_TAIL_BYTES = 2000
# What a run answering on its standard output keeps of it: the end, where an agent prints its
# answer after whatever it logged on the way.
STDOUT_TAIL_BYTES = 64 * 1024
# How often a running agent's drive reads whether its run was ended by another writer (a
# `salvor abandon` beside the daemon): the longest such a process runs on.
END_WATCH_SECONDS = 2.0


class _Tail:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = b""
        self.done = trio.Event()

    async def drain(self, stream) -> None:
        try:
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                self.data = (self.data + chunk)[-self.limit :]
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return
        finally:
            self.done.set()

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace").strip()


async def drive_process(
    access: StoreAccess,
    run_id: str,
    agent: AgentDefinition,
    *,
    proxy: ModelProxy | None = None,
    on_record: Callable[[list[Envelope]], None] | None = None,
    clock: Callable[[], datetime] = utc_now,
    environ: Mapping[str, str] = os.environ,
    restarts: int = 0,
    flows: FlowHost | None = None,
    workspace: Workspace | None = None,
    skills: SkillLibrary | None = None,
    attachable_mcp: Mapping[str, McpServerSpec] | None = None,
) -> RunView:
    """Drive a process run to its end (or until its process dies by a signal).

    ``restarts``: how many times this drive starts the process again, from
    the top of its log, after it was killed by a signal (the daemon passes a
    few; a bare ``Runtime`` none, so a caller sees each death). ``flows``: the
    host behind the ``salvor`` server's tools that need the daemon (a subagent,
    the run tree, authoring); without one those tools are not offered. ``workspace``: where
    the file tools the agent declares work (the ``salvor`` server offers them). ``skills``:
    where the agent's skills are found (``live_skills``; None: salvor's own only).
    ``attachable_mcp``: the operator's attachable MCP servers (``_process_attachments``).

    Raises:
        DriveInterrupted: the process was killed by a signal (more often than
            ``restarts``); the run keeps its log and the next drive starts it again.
        CallInFlight: an MCP call's identity stayed claimed by another run's
            unfinished call past the wait; nothing of the call was written, the
            process is stopped, and the next drive starts it again and asks again.
    """
    async with contextlib.AsyncExitStack() as stack:
        if proxy is None:
            proxy = await stack.enter_async_context(open_model_proxy())
        attempt = 0
        while True:
            try:
                return await _drive_once(
                    access,
                    run_id,
                    agent,
                    proxy,
                    on_record,
                    clock,
                    environ,
                    flows,
                    (workspace, skills),
                    attachable_mcp or {},
                )
            except DriveInterrupted as exc:
                # Restarts are for a process killed by a signal: an MCP call whose key another
                # run holds has already waited its bound, and a restart would only wait again.
                if attempt >= restarts or isinstance(exc, CallInFlight):
                    raise
                attempt += 1
                logger.warning(
                    "run %s: %s (restart %d of %d)", run_id, exc.message, attempt, restarts
                )


async def open_session(
    access: StoreAccess,
    ctx: RunContext,
    log: list[Envelope],
    agent: AgentDefinition,
    proxy: ModelProxy,
    environ: Mapping[str, str],
) -> ProxySession:
    """The proxy session of one drive; a re-run's is bound to its origin's
    recorded calls (and no upstream)."""
    return (await open_session_with_origin(access, ctx, log, agent, proxy, environ))[0]


async def open_session_with_origin(
    access: StoreAccess,
    ctx: RunContext,
    log: list[Envelope],
    agent: AgentDefinition,
    proxy: ModelProxy,
    environ: Mapping[str, str],
) -> tuple[ProxySession, list[Envelope] | None]:
    """The proxy session of one drive, and the origin's log for a re-run (its
    MCP lanes answer from it too)."""
    origin = log[0].event.replay_of
    if origin is None:
        session = ProxySession(
            ctx,
            log,
            record_prompts=agent.record_prompts,
            upstream=resolve_upstream(environ, key=proxy.upstream_key),
            client=proxy.client,
        )
        return session, None
    origin_log = await access.read(access.store.read_log, origin)
    session = ProxySession(
        ctx,
        log,
        record_prompts=agent.record_prompts,
        upstream=None,
        client=proxy.client,
        origin=origin,
        origin_calls=recorded_calls(origin_log),
    )
    return session, origin_log


async def supervise(
    process: trio.Process,
    timeout: float,
    *,
    until: trio.Event | None = None,
    stdout: _Tail | None = None,
) -> tuple[bool, str]:
    """Wait for an agent process to exit (or ``until`` to be set) within
    ``timeout``; then its whole group goes.

    Returns whether the timeout ran out, and the tail of its stderr; ``stdout``,
    when given, keeps the tail of its standard output (a pipe). On every way out
    (a cancellation included) nothing of the group is left running.
    """
    tail = _Tail(STDERR_TAIL_BYTES)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail.drain, process.stderr)
            if stdout is not None:
                nursery.start_soon(stdout.drain, process.stdout)
            with trio.move_on_after(timeout) as timer:
                async with trio.open_nursery() as waiters:

                    async def until_exit() -> None:
                        await process.wait()
                        waiters.cancel_scope.cancel(reason="the agent process exited")

                    waiters.start_soon(until_exit)
                    if until is not None:

                        async def until_set() -> None:
                            await until.wait()
                            waiters.cancel_scope.cancel(reason="the run rested: agent stopped")

                        waiters.start_soon(until_set)
            # Whatever is left of the group (children, a hung agent) goes with it.
            kill_group(process.pid)
            await process.wait()
            with trio.move_on_after(2):
                await tail.done.wait()
                if stdout is not None:
                    await stdout.done.wait()
            nursery.cancel_scope.cancel(reason="the agent process is gone; its stderr tail is read")
    finally:
        if process.returncode is None:
            kill_group(process.pid)
            with trio.CancelScope(shield=True):
                await process.wait()
        await process.stderr.aclose()
        if stdout is not None:
            await process.stdout.aclose()
    return timer.cancelled_caught, tail.text()


async def watch_for_an_end(
    access: StoreAccess, run_id: str, session: ProxySession, every: float = END_WATCH_SECONDS
) -> None:
    """Stop the drive (``session.supersede``) once the store says the run has ended under it.

    Another writer of the store may end a run this daemon drives: ``salvor abandon`` works beside
    a daemon. Its process must not run on until its next call meets the end, so its run's row is
    read every ``every`` seconds while it runs (one indexed read, on a reader thread). A read
    that fails is skipped: a store fault is for the run's own appends to meet.
    """
    while not session.rested.is_set():
        await trio.sleep(every)
        try:
            view = await access.read(access.store.read_view, run_id)
        except CodedError:
            continue
        if view is not None and view.terminal:
            session.supersede(f"run {run_id} {view.state.value} by another writer of the store")
            return


def parked_write(view: RunView) -> Pending | None:
    """The open write ``view`` is parked on, unless a client performed it (its client settles
    it); None when the run is not parked on one."""
    pending = view.pending
    if (
        view.state is not RunState.NEEDS_RECONCILIATION
        or pending is None
        or pending.performed_by is not None
    ):
        return None
    return pending


def probed_write(
    agent: AgentDefinition,
    view: RunView,
    log: Sequence[Envelope] = (),
    attachable: Mapping[str, McpServerSpec] | None = None,
    flows: FlowHost | None = None,
) -> bool:
    """Whether the process run ``view`` is parked on a write with a probe: one its server
    declares (an attached server's among them: ``log``, the run's; ``attachable``, the
    operator's file), an attached registry write's (``flows``: the host whose registry the
    ``salvor`` server relays), or a file write the ``salvor`` lane planned.

    Its drive starts the agent as any drive does; the agent's replay reaches that call, and the
    lane probes it while the agent waits (``McpLane``).
    """
    pending = parked_write(view)
    if pending is None:
        return False
    if probes_lane_write(agent.mcp_servers, pending.tool, pending.input):
        return True
    attached = attachments_before(view.labels, log, pending.seq)
    registry_tool = None if flows is None else flows.registry_tool
    return attached_lane_probe(
        agent, attachable or {}, attached, pending.tool, pending.input, registry_tool
    )


async def _drive_once(
    access, run_id, agent, proxy, on_record, clock, environ, flows, reach, attachable
) -> RunView:
    log = await access.read(access.store.read_log, run_id)
    ctx = RunContext(access, run_id, log, on_record=on_record, clock=clock)
    if ctx.view.idle and not probed_write(agent, ctx.view, log, attachable, flows):
        return ctx.view
    if ctx.view.state is RunState.SLEEPING:
        # Parked by an MCP tool's sleep_until: no process runs before the timer is due.
        if not await ctx.wake_when_due():
            return ctx.view
        log = await access.read(
            access.store.read_log, run_id
        )  # with the wake: the lane answers the call with it
    # ``reach``: where the agent's file tools work, and where its skills are found.
    workspace, library = reach
    skills = await live_skills(library or SkillLibrary(), agent.skills)
    if isinstance(skills, str):
        await ctx.record(RunFailed(error=skills))
        return ctx.view
    # Real MCP servers a lane starts carry the orphan mark, as the agent does.
    mark = {MARK_VAR: store_fingerprint(access.store.url), RUN_VAR: run_id}
    folders = [skill.folder for skill in skills]
    files = file_tools(workspace, agent.access, agent.tools, mark, folders)
    salvor = _salvor_server(ctx, agent, flows, files, log, skills)
    # The daemon's own client, for the servers attached to the run's tree.
    async with open_connections((), mark=mark, environ=environ) as attached:
        if not await offer_attached_servers(ctx, agent, log, attachable, attached, salvor):
            return ctx.view
        session, origin_log = await open_session_with_origin(
            access, ctx, log, agent, proxy, environ
        )
        async with open_lanes(
            session, agent.mcp_servers, log, origin_log, environ=environ, mark=mark, salvor=salvor
        ) as lanes:
            return await _run_process(ctx, session, lanes, agent, proxy, environ, log)


def _salvor_server(
    ctx: RunContext,
    agent: AgentDefinition,
    flows,
    files: FileTools,
    log: list[Envelope],
    skills: list[Skill],
) -> FlowServer | None:
    """The run's ``salvor`` server: its flow tools, the file tools the agent declares, and the
    tools attached to its tree as of its log (its head's, its ``ToolsAttached``, its own
    ``attach_tool`` answers): a process agent lists those attached since its last drive from
    this drive on."""
    if not agent.salvor_mcp:
        return None
    names = tree_tools(
        ctx.view.labels, [*attached_tools(e.event for e in log), *self_attached(log)]
    )
    return salvor_server(
        ctx.run_id, ctx.view.labels, agent.outputs, flows, files, attached=names, skills=skills
    )


async def _run_process(
    ctx: RunContext,
    session: ProxySession,
    lanes: dict[str, McpLane],
    agent: AgentDefinition,
    proxy: ModelProxy,
    environ,
    log: list[Envelope],
) -> RunView:
    run_id = ctx.run_id
    access = ctx.access
    run_input = log[0].event.input
    session.task = checked_task(run_input)
    capability = proxy.attach(session)
    stdout = _Tail(STDOUT_TAIL_BYTES) if agent.output_from == "stdout" else None
    try:
        async with standin_relays(agent, proxy.base(capability)) as relays:
            env = agent_environment(
                agent, run_id, run_input, proxy.base(capability), environ, relays
            )
            # The mark goes on after the definition's env: it is ours, not the
            # agent's, and a restarted salvor finds an orphan of this drive by it.
            env[MARK_VAR] = store_fingerprint(access.store.url)
            env[OWNER_VAR] = owner_mark()
            process, timed_out, stderr = await _start_and_supervise(
                ctx, session, agent, run_input, env, stdout
            )
            if process is None:
                return ctx.view
    finally:
        with trio.CancelScope(shield=True):
            await session.close()
        proxy.detach(capability)
    # The tail is whole: ``supervise`` read the pipe to its end before it returned.
    said = None if stdout is None else stdout.text()
    async with session.lock:
        return await settle_process(
            ctx, session, lanes, agent, process.returncode, timed_out, stderr, said
        )


async def _start_and_supervise(
    ctx: RunContext,
    session: ProxySession,
    agent: AgentDefinition,
    run_input: Any,
    env: dict[str, str],
    stdout: _Tail | None,
) -> tuple[trio.Process | None, bool, str]:
    """Start the agent's process and wait for it to end (``supervise``): the process, whether
    it ran past its timeout, its stderr's tail; no process when it could not be started (the
    run then failed, saying why)."""
    settings = agent.process
    access, run_id = ctx.access, ctx.run_id
    # No agent starts on a node that may no longer act on the run (its lease is lapsing).
    access.driving.gate(run_id)
    try:
        process = await open_tied_process(
            agent_command(agent, run_input),
            cwd=settings.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if stdout is None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        await session.close()
        async with session.lock:
            await ctx.record(
                RunFailed(
                    error=(
                        "the agent process could not be started "
                        f"({settings.command[0]}): {exc.strerror or exc}"
                    )
                )
            )
        return None, False, ""
    async with trio.open_nursery() as watching:
        watching.start_soon(watch_for_an_end, access, run_id, session)
        timed_out, stderr = await supervise(
            process, settings.timeout, until=session.rested, stdout=stdout
        )
        watching.cancel_scope.cancel(reason="the agent process is gone")
    return process, timed_out, stderr
