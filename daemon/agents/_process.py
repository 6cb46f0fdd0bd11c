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

Outcomes: exit 0 completes the run with its result: the agent's good ``finish``
on the ``salvor`` MCP server when it made one (exactly the checked result, with
or without a model call), else its standard output when the definition says
``output_from = "stdout"`` (stripped, its last ``STDOUT_TAIL_BYTES``), else the
final answer of the trajectory (``final_answer``: its text, or the tool calls it
ended on); a non-zero exit fails it with the exit code and the tail of its
stderr; an exit 0 with no model call and no finish fails with the diagnosis that
the client never honoured the injected base URL, and one whose model calls never
carried the run's prompt (a text input) fails saying the task never reached the
model; a timeout kills the whole process group and fails the run. A process
killed by a signal leaves the run recoverable (``DriveInterrupted``): the next
drive starts it again.

Every process run is offered the ``salvor`` MCP server (the flow tools,
``proxies._flow_server``) beside its declared servers, unless its definition says
``salvor_mcp = false``.

A run an MCP tool parked (``_meta.salvor``, see ``_mcp_lane``; the ``salvor``
server's ``ask_user`` parks it the same way) has its process stopped once the
wait is recorded, and holds nothing while it waits; so has one whose subagent's
child rests short of a result (the call's intent stays open, and the run is
driven again when the child ends).
A drive of a suspended run starts nothing; one of a sleeping run starts
nothing before its ``wake_at``, and after it records the wake first. Either
way the process then starts from the top of its log, as after a crash.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import trio
from salvor.protocol import (
    CodedError,
    Envelope,
    Pending,
    RunCompleted,
    RunFailed,
    RunState,
    RunView,
)

from ..flows import FlowHost
from ..mcp import McpServerSpec
from ..processes import (
    MARK_VAR,
    OWNER_VAR,
    RUN_VAR,
    child_environment,
    kill_group,
    open_tied_process,
    owner_mark,
    store_fingerprint,
)
from ..proxies import (
    SALVOR_SERVER,
    FlowServer,
    McpLane,
    ModelProxy,
    ProxySession,
    final_text,
    final_tool_calls,
    lane_probe,
    open_lanes,
    open_model_proxy,
    recorded_calls,
    resolve_upstream,
    salvor_server,
    variable_suffix,
)
from ..recording import CallInFlight, DriveInterrupted, RunContext, StoreAccess, utc_now
from ._agent_definition import AgentDefinition
from ._outside_definition import PROMPT_PLACEHOLDER

logger = logging.getLogger("salvor.process")
PLACEHOLDER_KEY = "salvor-placeholder"
STDERR_TAIL_BYTES = 2000
# What a run answering on its standard output keeps of it: the end, where an agent prints its
# answer after whatever it logged on the way.
STDOUT_TAIL_BYTES = 64 * 1024
# How often a running agent's drive reads whether its run was ended by another writer (a
# `salvor abandon` beside the daemon): the longest such a process runs on.
END_WATCH_SECONDS = 2.0


def task_prompt(run_input: Any) -> str:
    """The task as an agent reads it: the run input when it is a string, else its JSON."""
    return run_input if isinstance(run_input, str) else json.dumps(run_input, ensure_ascii=False)


def agent_command(agent: AgentDefinition, run_input: Any) -> tuple[str, ...]:
    """The argv a run of ``agent`` starts: its ``command`` with each ``{prompt}`` element
    replaced by the task (``task_prompt``), which stays one argument whatever it holds.

    The task is data, not a secret, but an argument is readable by every local user
    (``/proc/<pid>/cmdline``); ``SALVOR_PROMPT`` carries it without that.
    """
    prompt = task_prompt(run_input)
    return tuple(prompt if arg == PROMPT_PLACEHOLDER else arg for arg in agent.process.command)


def checked_task(run_input: Any) -> str | None:
    """The text a model request must carry for a run's task to count as having reached the
    model: a text input, stripped; None (nothing checked) for a structured input, which an
    agent may well present to its model in its own words, or a blank one."""
    if not isinstance(run_input, str) or not run_input.strip():
        return None
    return run_input.strip()


def standin_servers(agent: AgentDefinition) -> tuple[McpServerSpec, ...]:
    """The servers a run of ``agent`` reaches through stand-ins: its own, then ``salvor``."""
    if not agent.salvor_mcp:
        return agent.mcp_servers
    return (*agent.mcp_servers, McpServerSpec(name=SALVOR_SERVER))


def write_relays(agent: AgentDefinition, base: str) -> tuple[str, dict[str, str]]:
    """A private directory (0700) with one relay file (0600) per stand-in of a run of
    ``agent``, each holding its endpoint's URL; the directory and each server's file.

    The URL is a capability of the run (``base``): it goes where only the daemon's user reads
    it, never on a command line. Blocking: call it off the trio thread.
    """
    directory = tempfile.mkdtemp(prefix="salvor-relay-")
    files = {}
    for spec in standin_servers(agent):
        path = os.path.join(directory, variable_suffix(spec.name))
        held = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(held, "w", encoding="utf-8") as out:
            out.write(f"{base}/mcp/{spec.name}\n")
        files[spec.name] = path
    return directory, files


@asynccontextmanager
async def standin_relays(agent: AgentDefinition, base: str) -> AsyncIterator[dict[str, str]]:
    """The relay files of one drive's stand-ins (``write_relays``), removed when it ends."""
    directory, files = await trio.to_thread.run_sync(write_relays, agent, base)
    try:
        yield files
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(shutil.rmtree, directory, True)


def standin_environment(
    agent: AgentDefinition, base: str, relays: Mapping[str, str]
) -> dict[str, str]:
    """One pair of variables per MCP server the run reaches, each naming that server's stand-in.

    ``SALVOR_MCP_SERVER_<NAME>``: a shell-quoted command line the agent's MCP
    configuration spawns in place of the server (the stdio relay, given the
    file in ``relays`` that holds its endpoint: MCP clients spawn servers with a
    scrubbed environment, and a command line is no place for a capability);
    ``SALVOR_MCP_URL_<NAME>``: the streamable-HTTP endpoint it may dial
    instead. Both reach the same lane, whatever the real server speaks (the
    ``salvor`` server's answers in this process). A server with no relay file
    gets no ``SALVOR_MCP_SERVER_<NAME>``.
    """
    env = {}
    for spec in standin_servers(agent):
        url = f"{base}/mcp/{spec.name}"
        suffix = variable_suffix(spec.name)
        if spec.name in relays:
            env[f"SALVOR_MCP_SERVER_{suffix}"] = shlex.join(
                [sys.executable, "-m", "salvor.daemon.standin", relays[spec.name]]
            )
        env[f"SALVOR_MCP_URL_{suffix}"] = (
            url if spec.port is None else f"http://127.0.0.1:{spec.port}/mcp"
        )
    return env


def agent_environment(
    agent: AgentDefinition,
    run_id: str,
    run_input: Any,
    base: str,
    environ: Mapping[str, str] = os.environ,
    relays: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The process's environment: the allow-list of the daemon's (``_child_env``), the
    injection, the definition's ``env``. ``relays``: each stand-in's relay file
    (``standin_relays``)."""
    env = child_environment(environ)
    prompt = task_prompt(run_input)
    env.update(
        {
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_BASE": f"{base}/v1",
            "OPENAI_BASE": f"{base}/v1",
            "ANTHROPIC_BASE_URL": base,
            "SALVOR_LLM_PROXY": f"{base}/v1",
            "OPENAI_API_KEY": PLACEHOLDER_KEY,
            "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
            "SALVOR_PROMPT": prompt,
            "SALVOR_INPUT": json.dumps(run_input, ensure_ascii=False),
            "SALVOR_RUN_ID": run_id,
        }
    )
    env.update(standin_environment(agent, base, relays or {}))
    env.update(agent.process.env)
    return env


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
) -> RunView:
    """Drive a process run to its end (or until its process dies by a signal).

    ``restarts``: how many times this drive starts the process again, from
    the top of its log, after it was killed by a signal (the daemon passes a
    few; a bare ``Runtime`` none, so a caller sees each death). ``flows``: the
    host behind the ``salvor`` server's tools that need the daemon (a subagent,
    the run tree, authoring); without one those tools are not offered.

    Raises:
        DriveInterrupted: the process was killed by a signal (more often than
            ``restarts``); the run keeps its log and the next drive starts it again.
        CallInFlight: an MCP call's identity stayed claimed by another run's
            unfinished call past the wait; nothing of the call was written, the
            process is stopped, and the next drive starts it again and asks again.
    """
    if proxy is None:
        async with open_model_proxy() as own:
            return await drive_process(
                access,
                run_id,
                agent,
                proxy=own,
                on_record=on_record,
                clock=clock,
                environ=environ,
                restarts=restarts,
                flows=flows,
            )
    attempt = 0
    while True:
        try:
            return await _drive_once(access, run_id, agent, proxy, on_record, clock, environ, flows)
        except DriveInterrupted as exc:
            # Restarts are for a process killed by a signal: an MCP call whose key another
            # run holds has already waited its bound, and a restart would only wait again.
            if attempt >= restarts or isinstance(exc, CallInFlight):
                raise
            attempt += 1
            logger.warning("run %s: %s (restart %d of %d)", run_id, exc.message, attempt, restarts)


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


async def superseded_view(ctx: RunContext) -> RunView:
    """Where the run is after another writer appended under this drive (``session.superseded``):
    the log says, not the agent's exit. An ended run (abandoned beside this daemon) is returned
    as that writer left it.

    Raises:
        DriveInterrupted: the run did not end; it keeps its log, for a later drive to go on from.
    """
    run_id = ctx.run_id
    view = await ctx.access.read(ctx.access.store.read_view, run_id)
    if view is not None and view.terminal:
        return view
    raise DriveInterrupted(
        f"another writer appended to run {run_id} while this drive ran; the run keeps its "
        f"log, and `salvor resume {run_id}` goes on from it"
    )


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


def probed_write(agent: AgentDefinition, view: RunView) -> bool:
    """Whether the process run ``view`` is parked on a write its server declares a probe for.

    Its drive starts the agent as any drive does; the agent's replay reaches that call, and the
    server's lane probes it while the agent waits (``McpLane``).
    """
    pending = parked_write(view)
    return pending is not None and (
        lane_probe(agent.mcp_servers, pending.tool, pending.input) is not None
    )


async def _drive_once(access, run_id, agent, proxy, on_record, clock, environ, flows) -> RunView:
    log = await access.read(access.store.read_log, run_id)
    ctx = RunContext(access, run_id, log, on_record=on_record, clock=clock)
    if ctx.view.idle and not probed_write(agent, ctx.view):
        return ctx.view
    if ctx.view.state is RunState.SLEEPING:
        # Parked by an MCP tool's sleep_until: no process runs before the timer is due.
        if not await ctx.wake_when_due():
            return ctx.view
        log = await access.read(
            access.store.read_log, run_id
        )  # with the wake: the lane answers the call with it
    session, origin_log = await open_session_with_origin(access, ctx, log, agent, proxy, environ)
    # Real MCP servers a lane starts carry the orphan mark, as the agent does.
    mark = {MARK_VAR: store_fingerprint(access.store.url), RUN_VAR: run_id}
    salvor = _salvor_server(ctx, agent, flows)
    async with open_lanes(
        session, agent.mcp_servers, log, origin_log, environ=environ, mark=mark, salvor=salvor
    ) as lanes:
        return await _run_process(ctx, session, lanes, agent, proxy, environ, log)


def _salvor_server(ctx: RunContext, agent: AgentDefinition, flows) -> FlowServer | None:
    if not agent.salvor_mcp:
        return None
    return salvor_server(ctx.run_id, ctx.view.labels, agent.outputs, flows)


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
    async with session.lock:
        return await _settle(
            ctx, session, lanes, agent, process.returncode, timed_out, stderr, stdout
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


async def _settle(
    ctx: RunContext,
    session: ProxySession,
    lanes: Mapping[str, McpLane],
    agent: AgentDefinition,
    code: int,
    timed_out: bool,
    stderr: str,
    stdout: _Tail | None = None,
) -> RunView:
    if session.store_fault is not None:
        # The process ended because the store failed under its call, not by its own doing.
        raise session.store_fault
    if session.interrupted is not None:
        # A lane stopped the drive before its call was written (another run holds its key).
        raise session.interrupted
    if session.superseded is not None:
        return await superseded_view(ctx)
    if (
        session.rested.is_set()
        or ctx.view.terminal
        or ctx.view.state is RunState.NEEDS_RECONCILIATION
    ):
        # Failed or parked already (an MCP write cut off mid-call parks it): the log says why.
        return ctx.view
    failure = _exit_failure(session, lanes, agent, code, timed_out, stderr, ctx.run_id)
    if failure is None:
        await ctx.record(RunCompleted(output=run_output(session, stdout)))
    else:
        await ctx.record(RunFailed(error=failure))
    return ctx.view


def _exit_failure(
    session: ProxySession,
    lanes: Mapping[str, McpLane],
    agent: AgentDefinition,
    code: int,
    timed_out: bool,
    stderr: str,
    run_id: str,
) -> str | None:
    """Why a run whose agent process exited (``code``) without a recorded end fails, or None
    when the exit completes it.

    Raises:
        DriveInterrupted: a signal killed the process; the run keeps its log for a resume.
    """
    tail = f"; its stderr ended with:\n{stderr}" if stderr else "; it printed nothing to stderr"
    if timed_out:
        failure = (
            "the agent process ran past its timeout of "
            f"{agent.process.timeout:g}s; its process group was killed"
        )
    elif code < 0:
        raise DriveInterrupted(
            f"the agent process of run {run_id} was killed by signal {-code}; the run keeps its "
            f"log, and `salvor resume {run_id}` starts it again with the recorded "
            "model calls answered from the log"
        )
    elif code != 0:
        when = " before any model call" if not session.calls else ""
        failure = f"the agent process exited with code {code}{when}{tail}"
    elif not session.calls and session.finished is None:
        failure = (
            "the agent process exited 0 without making any model call or calling `finish`: its "
            "client never reached the salvor proxy. Point it at OPENAI_BASE_URL (OpenAI clients) "
            "or ANTHROPIC_BASE_URL (Anthropic clients), which salvor sets; or map them in the "
            "definition's `env` for a client that reads another variable"
        )
    elif (short := replay_shortfall(session, "the agent process exited 0")) is not None:
        failure = short
    elif (
        unreached := next((n for lane in lanes.values() if (n := lane.never_contacted())), None)
    ) is not None:
        failure = unreached
    elif short := next(
        (n for lane in lanes.values() if (n := lane.shortfall("the agent process exited 0"))), None
    ):
        failure = short
    elif session.finished is None and session.task is not None and not session.task_reached:
        count = len(session.calls)
        failure = (
            f"the agent process exited 0, but none of its {count} model "
            f"{'call' if count == 1 else 'calls'} carried the run's prompt: the task never "
            "reached its model, so what it answered is not an answer to it. Give the program its "
            "prompt: a `{prompt}` element in `command` becomes the prompt as one argument, and "
            "SALVOR_PROMPT holds it in the environment"
        )
    else:
        return None
    return failure


def run_output(session: ProxySession, stdout: _Tail | None) -> Any:
    """What a process run that exited 0 completes with.

    Its good ``finish`` when it made one (the checked result, as a child's
    parent reads it); else, with ``"exit_code": 0``, its standard output as
    ``"reply"`` when it answers there (``stdout``, nothing when it printed
    nothing), else its ``final_answer``.
    """
    if session.finished is not None:
        return session.finished
    if stdout is None:
        return {**final_answer(session), "exit_code": 0}
    reply = stdout.text() or None
    return {"exit_code": 0} if reply is None else {"reply": reply, "exit_code": 0}


def final_answer(session: ProxySession) -> dict[str, Any]:
    """What the drive's last answered model call answered, as a run's output holds it.

    ``{"reply": <text>}`` when it answered in text; ``{"tool_calls": [{"name",
    "arguments"}, ...]}`` when it called tools, in the model's order, each call's
    arguments parsed from their JSON: a framework that ends on a tool call (smolagents'
    ``final_answer``) answers there, and the model never hears back; ``{}`` when no
    call was answered.
    """
    last = next((c for c in reversed(session.calls) if c.response is not None), None)
    if last is None:
        return {}
    wire = last.response.get("wire")
    if calls := final_tool_calls(wire, last.response):
        return {"tool_calls": calls}
    text = final_text(wire, last.response)
    return {} if text is None else {"reply": text}


def replay_shortfall(session: ProxySession, what_ended: str) -> str | None:
    """Why a drive that ended before making every call it had to reproduce fails;
    None when it made them all."""
    short = session.replay.shortfall(what_ended)
    return None if short is None else short.message
