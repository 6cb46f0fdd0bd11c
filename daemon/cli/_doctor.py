"""``salvor doctor AGENT``: does this process agent's model traffic reach salvor's proxy?

The agent is started once, exactly as a run starts it (the same environment
injection, its own process group, stdout discarded, stderr kept), against a
loopback proxy of its own that records nothing and calls no model: every
model call is answered with a short canned final text in the wire shape the
client asked for (``_doctor_replies``). No store is opened.

The report says whether traffic arrived (which wire, path, model, how many
calls), how the process ended, and, when nothing arrived, why: the command
did not start, it exited non-zero first (its code and stderr tail), it asked
the proxy for a path the proxy does not serve (named), or it exited 0 having
called nothing, which means its client never read the injected base URL.

Exit status: 0 traffic reached the proxy, 1 it did not, 2 the definition or
the command line is wrong (one sentence).

Decisions: AGENT is a file, never a stored agent's hash, because doctor
opens no store (a hash would need one). The agent carries no store mark
(``SALVOR_DAEMON``, see ``_orphans``): no store is involved, and doctor kills
the agent's process group itself, on every way out including Ctrl-C.

What doctor found, and the report it makes of it, are ``_doctor_findings``'s.
"""

from __future__ import annotations

import argparse
import contextvars
import dataclasses
import json
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Mapping
from typing import Any

import trio

from ..agents import (
    AgentDefinition,
    AgentKind,
    DefinitionError,
    agent_command,
    agent_environment,
    load_definition,
    standin_relays,
    supervise,
)
from ..processes import open_tied_process
from ..proxies import encode_frames, error_body, open_model_proxy
from ._doctor_findings import (
    EXIT_NOT_REACHED,
    EXIT_USAGE,
    Ending,
    Findings,
    Request,
    findings_json,
    report,
)
from ._doctor_replies import CANNED

DEFAULT_INPUT = "Say hello in one short sentence."
# A definition's timeout is sized for real work; a wiring check that has not
# seen a call after a minute will not see one.
TIMEOUT_CAP = 60.0


class UsageError(Exception):
    """The definition or the command line is wrong; the message is one sentence."""


_CURRENT: contextvars.ContextVar[Request] = contextvars.ContextVar("salvor_doctor_request")


class Watch:
    """ASGI wrapper around the proxy: notes every request and the status it got."""

    def __init__(self, app) -> None:
        self.app = app
        self.requests: list[Request] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        entry = Request(scope["method"], scope["path"])
        self.requests.append(entry)

        async def noting_send(message) -> None:
            if message["type"] == "http.response.start":
                entry.status = message["status"]
            await send(message)

        # The proxy hands the call to the session in this same task, so the
        # session finds its request here.
        token = _CURRENT.set(entry)
        try:
            await self.app(scope, receive, noting_send)
        finally:
            _CURRENT.reset(token)


class DoctorSession:
    """Stands where a run's ``ProxySession`` stands: answers each call with
    canned text, records nothing."""

    async def handle(self, wire: str, body: dict, headers: Mapping[str, str], reply) -> None:
        entry = _CURRENT.get()
        entry.wire, entry.model, entry.stream = wire, body.get("model"), bool(body.get("stream"))
        canned = CANNED.get(wire)
        if canned is None:
            await reply.json(
                501,
                error_body(wire, 501, f"salvor doctor has no canned reply for the {wire} wire yet"),
            )
        elif entry.stream:
            await reply.start_stream(200)
            await reply.chunk(encode_frames(canned.frames(body)))
            await reply.end()
        else:
            await reply.json(200, canned.body(body))


async def _run_agent(
    agent: AgentDefinition, run_input: str, env: dict[str, str], timeout: float
) -> Ending:
    settings = agent.process
    try:
        process = await open_tied_process(
            agent_command(agent, run_input),
            cwd=settings.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        where = f" in {settings.cwd}" if settings.cwd else ""
        return Ending(
            start_error=(
                f"`{settings.command[0]}`{where} could not be started: {exc.strerror or exc}"
            )
        )
    timed_out, stderr = await supervise(process, timeout)
    if timed_out:
        return Ending(timed_out=True, stderr=stderr)
    return Ending(code=process.returncode, stderr=stderr)


def _overridden(
    agent: AgentDefinition,
    env: Mapping[str, str],
    base: str,
    run_id: str,
    run_input: Any,
    environ: Mapping[str, str],
) -> dict[str, str]:
    """The injected base URL variables whose value the definition's ``env`` replaced."""
    bare = dataclasses.replace(agent, process=dataclasses.replace(agent.process, env={}))
    injected = agent_environment(bare, run_id, run_input, base, environ)
    return {k: env.get(k, "") for k, v in injected.items() if base in v and env.get(k) != v}


async def examine(
    agent: AgentDefinition, run_input: str, timeout: float, environ: Mapping[str, str] = os.environ
) -> Findings:
    """Start the agent once against a doctor proxy and collect what happened."""
    watch: Watch | None = None

    def wrap(app):
        nonlocal watch
        watch = Watch(app)
        return watch

    run_id = str(uuid.uuid4())
    async with open_model_proxy(wrap=wrap) as proxy:
        capability = proxy.attach(DoctorSession())
        base = proxy.base(capability)
        try:
            async with standin_relays(agent, base) as relays:
                env = agent_environment(agent, run_id, run_input, base, environ, relays)
                ending = await _run_agent(agent, run_input, env, timeout)
        finally:
            proxy.detach(capability)
    return Findings(
        agent=agent,
        timeout=timeout,
        prefix=f"/r/{capability}",
        ending=ending,
        requests=list(watch.requests) if watch else [],
        overridden=_overridden(agent, env, base, run_id, run_input, environ),
    )


# -- the report ----------------------------------------------------------------


# -- the command ---------------------------------------------------------------


def add_parser(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help=(
            "start a process agent once against a canned proxy: does "
            "its model traffic reach salvor?"
        ),
    )
    p.add_argument("agent", metavar="AGENT", help='agent file (TOML or JSON) of kind = "process"')
    p.add_argument(
        "--input",
        metavar="TEXT",
        default=DEFAULT_INPUT,
        help=f"the task handed to the agent (default {DEFAULT_INPUT!r})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help=f"how long the agent may run (default: the definition's, at most {TIMEOUT_CAP:g})",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the findings as one JSON object (reached, requests, process, and report: the "
        "lines the text answer prints)",
    )


async def _load(source: str) -> AgentDefinition:
    if source.startswith("sha256:"):
        raise UsageError(
            "doctor reads an agent file and opens no store; pass the TOML or JSON file the agent "
            "was registered from, not its sha256: hash"
        )
    try:
        agent = await trio.to_thread.run_sync(load_definition, source)
    except DefinitionError as exc:
        raise UsageError(f"{source}: {exc}") from None
    if agent.kind is AgentKind.SERVICE:
        raise UsageError(
            f"{source} is a service agent, which salvor does not start; "
            'doctor checks process agents (kind = "process")'
        )
    if agent.kind is not AgentKind.PROCESS:
        raise UsageError(
            f"{source} is a built-in agent, which salvor drives itself; "
            'doctor checks process agents (kind = "process")'
        )
    return agent


def _timeout(given: float | None, agent: AgentDefinition) -> float:
    if given is None:
        return min(agent.process.timeout, TIMEOUT_CAP)
    if not math.isfinite(given) or given <= 0:
        raise UsageError(f"--timeout {given:g} must be a positive number of seconds")
    return given


async def doctor_main(args: argparse.Namespace) -> int:
    try:
        agent = await _load(args.agent)
        timeout = _timeout(args.timeout, agent)
    except UsageError as exc:
        print(f"salvor: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    try:
        findings = await examine(agent, args.input, timeout)
    except OSError as exc:
        # The agent's own start failure is a finding; this is doctor's proxy.
        print(
            f"salvor: doctor could not open its loopback proxy on 127.0.0.1: {exc.strerror or exc}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_NOT_REACHED
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        # By now the agent's process group is gone (examine's cleanup ran).
        print(
            "salvor: doctor interrupted before the agent finished; its process group was killed",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_NOT_REACHED
    lines, code = report(findings)
    if args.json:
        print(json.dumps(findings_json(findings, lines, code), ensure_ascii=False), flush=True)
    else:
        print("\n".join(lines), flush=True)
    return code


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C, which trio may hand back wrapped in a nursery's exception group."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(KeyboardInterrupt) is not None
    return isinstance(exc, KeyboardInterrupt)
