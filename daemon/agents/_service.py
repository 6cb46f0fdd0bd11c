"""Driving a service agent: a program already running, triggered by one POST.

salvor cannot inject a base URL into a service it did not start, so the
service is started (by whoever runs it) with its model base URL at a fixed
loopback port, the definition's ``proxy_port``. For the length of a drive
salvor listens there and serves this run's proxy session at the root of the
port (``/v1/chat/completions``, ``/v1/messages``, ``/v1/models``), then POSTs
``{"prompt": <task>}`` to the service's ``url`` and waits for its answer
within the timeout.

The verdict comes from the trajectory, never the trigger's HTTP status: a
divergence has already failed the run; a trigger answered with no model call
at all fails it with the port the service should point at; otherwise the run
completes with the final assistant message and the status the trigger got.
After a crash the next drive binds again and POSTs the same trigger again:
the proxy answers the recorded prefix from the log, then goes live. A
re-run (``replay_of``) is answered from its origin's calls, never live.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import trio
from salvor.protocol import Envelope, RunCompleted, RunFailed, RunView

from ..processes import PortClaims
from ..proxies import ModelProxy, ProxySession, open_model_proxy
from ..recording import RunContext, StoreAccess, utc_now
from ..web import JSON_PORTS, UnfillableHeader, fill_headers, listener_config, tls_context
from ..web import serve as serve_asgi
from ._agent_definition import AgentDefinition
from ._process import open_session, watch_for_an_end
from ._process_environment import task_prompt
from ._process_outcome import final_answer, replay_shortfall, superseded_view

logger = logging.getLogger("salvor.service")


def wiring_hint(port: int) -> str:
    """How to start a service so its model calls reach the proxy on ``port``."""
    return (
        "start the service with its model base URL at the salvor proxy: "
        f"OPENAI_BASE_URL=http://127.0.0.1:{port}/v1 (OpenAI clients) or "
        f"ANTHROPIC_BASE_URL=http://127.0.0.1:{port} (Anthropic clients)"
    )


class _RootMount:
    """ASGI app serving one run's session at the root of its own port.

    It rewrites ``/<rest>`` to the shared proxy's ``/r/<capability>/<rest>``,
    so every route the shared proxy serves is served here the same way.
    """

    def __init__(self, proxy: ModelProxy, capability: str) -> None:
        self._proxy = proxy
        self._prefix = f"/r/{capability}"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            path = self._prefix + "/" + scope["path"].lstrip("/")
            scope = {**scope, "path": path, "raw_path": path.encode("latin-1")}
        await self._proxy(scope, receive, send)


def _bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port``.

    Raises:
        OSError: the port cannot be bound (another program holds it).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # A listener of this daemon's previous life may leave the port in
        # TIME_WAIT; that must not keep a recovered run from binding it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def _serve_port(
    app: _RootMount, sock: socket.socket, stop: trio.Event, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    # hypercorn takes the bound socket over by descriptor (and closes it when done).
    config = listener_config(f"fd://{sock.detach()}", "salvor.service.http", graceful_timeout=1.0)
    await serve_asgi(
        app, config, browsers=JSON_PORTS, shutdown_trigger=stop.wait, task_status=task_status
    )


@dataclass(slots=True)
class _Trigger:
    """What became of the POST: the status it was answered with, or why it was not."""

    status: int | None = None
    unreachable: str | None = None
    broken: str | None = None
    timed_out: bool = False


async def drive_service(
    access: StoreAccess,
    run_id: str,
    agent: AgentDefinition,
    *,
    proxy: ModelProxy | None = None,
    ports: PortClaims | None = None,
    on_record: Callable[[list[Envelope]], None] | None = None,
    clock: Callable[[], datetime] = utc_now,
    environ: Mapping[str, str] = os.environ,
) -> RunView:
    """Drive a service run to its end: bind its port, POST its trigger, settle from the trajectory.

    ``ports``: the daemon's port claims; the drive holds the agent's port
    while it is bound (waiting for another run of this daemon to let go).

    Every outcome is recorded (completed or failed) except a cancellation:
    then the run keeps its log, an open model intent included, and the next
    drive triggers the service again with the recorded calls answered from
    the log.
    """
    if proxy is None:
        async with open_model_proxy() as own:
            return await drive_service(
                access,
                run_id,
                agent,
                proxy=own,
                ports=ports,
                on_record=on_record,
                clock=clock,
                environ=environ,
            )
    ports = ports if ports is not None else PortClaims()
    async with ports.hold(agent.service.proxy_port, run_id):
        return await _drive_once(access, run_id, agent, proxy, on_record, clock, environ)


async def _drive_once(access, run_id, agent, proxy, on_record, clock, environ) -> RunView:
    settings = agent.service
    log = await access.read(access.store.read_log, run_id)
    ctx = RunContext(access, run_id, log, on_record=on_record, clock=clock)
    if ctx.view.idle:
        return ctx.view
    try:
        headers = fill_headers(settings.headers, environ)
    except UnfillableHeader as exc:
        await ctx.record(RunFailed(error=f"{exc}; nothing was sent to {settings.url}"))
        return ctx.view
    session = await open_session(access, ctx, log, agent, proxy, environ)
    try:
        sock = _bind(settings.proxy_port)
    except OSError as exc:
        why = (
            "another program holds it"
            if exc.errno == errno.EADDRINUSE
            else (exc.strerror or str(exc))
        )
        await ctx.record(
            RunFailed(
                error=(
                    f"the proxy port {settings.proxy_port} of this service agent cannot be bound "
                    f"on 127.0.0.1: {why}; nothing was sent to {settings.url}"
                )
            )
        )
        return ctx.view
    capability = proxy.attach(session)
    try:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(_serve_port, _RootMount(proxy, capability), sock, stop)
            except BaseException:
                if sock.fileno() != -1:
                    sock.close()
                raise
            # A run ended beside this daemon (``salvor abandon``) stops the wait for the trigger
            # within seconds, though the service never calls again.
            nursery.start_soon(watch_for_an_end, access, run_id, session)
            trigger = await _send_trigger(
                settings, task_prompt(log[0].event.input), headers, session
            )
            stop.set()
            nursery.cancel_scope.cancel(reason="the trigger was answered; the proxy port closes")
    finally:
        with trio.CancelScope(shield=True):
            await session.close()
        proxy.detach(capability)
    async with session.lock:
        return await _settle(ctx, session, agent, trigger)


async def _send_trigger(
    settings, prompt: str, headers: dict[str, str], session: ProxySession
) -> _Trigger:
    """POST the trigger and wait for its answer, the run's failure, or the
    timeout, whichever comes first."""
    # No trigger goes out from a node that may no longer act on the run (its lease is lapsing).
    session.ctx.access.driving.gate(session.run_id)
    trigger = _Trigger()
    # The service runs on this machine (its model calls reach a loopback
    # port), so the environment's HTTP proxies are not for this request.
    timeout = httpx.Timeout(None)
    async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=tls_context()) as client:
        with trio.move_on_after(settings.timeout) as timer:
            async with trio.open_nursery() as waiters:

                async def post() -> None:
                    try:
                        answer = await client.post(
                            settings.url, json={"prompt": prompt}, headers=headers
                        )
                        trigger.status = answer.status_code
                    except httpx.ConnectError as exc:
                        trigger.unreachable = str(exc) or type(exc).__name__
                    except httpx.HTTPError as exc:
                        trigger.broken = str(exc) or type(exc).__name__
                    else:
                        # The proxy hands the service its answer before it
                        # records the completion, so the service can answer
                        # the trigger first. Closing the session now would
                        # cut that record: wait for the call holding the
                        # run's call slot to let go (within the timeout).
                        async with session.lock:
                            pass
                    waiters.cancel_scope.cancel(reason="the service answered its trigger")

                async def until_rested() -> None:
                    await session.rested.wait()
                    waiters.cancel_scope.cancel(reason="the run rested before the trigger answered")

                waiters.start_soon(post)
                waiters.start_soon(until_rested)
        trigger.timed_out = timer.cancelled_caught
    return trigger


async def _settle(
    ctx: RunContext, session: ProxySession, agent: AgentDefinition, trigger: _Trigger
) -> RunView:
    settings = agent.service
    url, port = settings.url, settings.proxy_port
    if session.store_fault is not None:
        # The store failed under one of its calls: the drive stops for the
        # healer, the run stays as it was.
        raise session.store_fault
    if session.superseded is not None:
        return await superseded_view(ctx)
    if session.rested.is_set() or ctx.view.terminal:
        return ctx.view
    if trigger.timed_out:
        failure = (
            f"the service at {url} did not answer its trigger within its "
            f"timeout of {settings.timeout:g}s"
        )
    elif trigger.unreachable is not None:
        failure = (
            f"the service at {url} could not be reached to trigger the run: {trigger.unreachable}"
        )
    elif trigger.broken is not None:
        failure = f"the trigger POST to {url} broke off before its answer: {trigger.broken}"
    elif not session.calls:
        failure = (
            f"the service at {url} answered its trigger with HTTP {trigger.status} without making "
            f"any model call through the salvor proxy on port {port}: {wiring_hint(port)}"
        )
    elif (
        short := replay_shortfall(
            session, f"the service answered its trigger (HTTP {trigger.status})"
        )
    ) is not None:
        failure = f"{short}; {wiring_hint(port)}, and let no other caller reach it during the run"
    else:
        output: dict[str, Any] = {**final_answer(session), "trigger_status": trigger.status}
        await ctx.record(RunCompleted(output=output))
        return ctx.view
    await ctx.record(RunFailed(error=failure))
    return ctx.view
