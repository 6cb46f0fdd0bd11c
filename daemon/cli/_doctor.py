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
"""

from __future__ import annotations

import argparse
import contextvars
import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
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
from ..proxies import ROUTES, encode_frames, error_body, open_model_proxy
from ._doctor_replies import CANNED

DEFAULT_INPUT = "Say hello in one short sentence."
# A definition's timeout is sized for real work; a wiring check that has not
# seen a call after a minute will not see one.
TIMEOUT_CAP = 60.0
STDERR_LINES = 12
EXIT_REACHED, EXIT_NOT_REACHED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """The definition or the command line is wrong; the message is one sentence."""


@dataclass(slots=True)
class Request:
    """One HTTP request the agent sent the proxy, and what became of it."""

    method: str
    path: str
    status: int | None = None
    wire: str | None = None  # set when it was a model call doctor answered
    model: Any = None
    stream: bool = False


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


@dataclass(slots=True)
class Ending:
    """How the agent process ended."""

    code: int | None = None  # None: never started, or killed at the timeout
    timed_out: bool = False
    stderr: str = ""
    start_error: str | None = None


@dataclass(slots=True)
class Findings:
    agent: AgentDefinition
    timeout: float
    prefix: str  # the capability path the injected base URLs carry
    ending: Ending
    requests: list[Request] = field(default_factory=list)
    overridden: dict[str, str] = field(
        default_factory=dict
    )  # injected base URL variables the definition's env replaced

    @property
    def served(self) -> list[Request]:
        return [r for r in self.requests if r.wire is not None]

    @property
    def refused(self) -> list[Request]:
        """Requests for a path the proxy does not serve."""
        return [r for r in self.requests if r.wire is None and r.status == 404]

    @property
    def rejected(self) -> list[Request]:
        """Requests on a served path whose body the proxy could not take
        (not a JSON object, too large)."""
        return [
            r
            for r in self.requests
            if r.wire is None and r.status is not None and r.status >= 400 and r.status != 404
        ]


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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _where(findings: Findings, request: Request) -> str:
    if request.path == findings.prefix or request.path.startswith(findings.prefix + "/"):
        return f"{request.method} {request.path[len(findings.prefix) :] or '/'}"
    return f"{request.method} {request.path} (outside the injected base URL)"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _traffic(findings: Findings) -> list[str]:
    served = findings.served
    if not served:
        return ["proxy: no model call reached it"]
    groups: dict[tuple, list[Request]] = {}
    for request in served:
        groups.setdefault(
            (request.wire, _where(findings, request), request.stream, request.status), []
        ).append(request)
    lines = [f"proxy: {_plural(len(served), 'model call')} reached it"]
    for (wire, where, stream, status), requests in groups.items():
        canned = CANNED.get(wire)
        label = canned.label if canned else wire
        models = ", ".join(sorted({repr(r.model) for r in requests}))
        how = "streamed" if stream else "not streamed"
        note = "" if status == 200 else f", answered {status}: doctor cannot answer this wire yet"
        lines.append(f"  {len(requests)} x {label} ({where}, {how}), model {models}{note}")
    return lines


def _ending(findings: Findings) -> str:
    e = findings.ending
    if e.start_error:
        return f"process: {e.start_error}"
    if e.timed_out:
        return f"process: killed with its process group after the {findings.timeout:g}s timeout"
    if e.code < 0:
        return f"process: killed by signal {-e.code}"
    return f"process: exited with code {e.code}"


def _stderr(e: Ending) -> str:
    if not e.stderr:
        return "; it printed nothing to stderr"
    # The last lines say what went wrong (a traceback ends with its exception).
    last = "\n".join(e.stderr.splitlines()[-STDERR_LINES:])
    return f"; its stderr ended with:\n{_indent(last)}"


def _diagnosis(findings: Findings) -> list[str]:
    """Why nothing reached the proxy: every cause seen, the wiring ones first."""
    e = findings.ending
    if e.start_error:
        return ["diagnosis: the agent never ran; check `command` (and `cwd`) in the definition"]
    lines = []
    if findings.overridden:
        names = ", ".join(f"{k}={v!r}" for k, v in findings.overridden.items())
        lines.append(
            f"diagnosis: the definition's `env` replaces the base URL salvor injects ({names}); "
            f"remove it from `env` so the client is pointed at the proxy"
        )
    if findings.refused:
        paths = ", ".join(sorted({_where(findings, r) for r in findings.refused}))
        served = ", ".join(
            f"POST /{path} ({CANNED[wire].label if wire in CANNED else wire})"
            for path, wire in ROUTES.items()
        )
        lines.append(
            f"diagnosis: the agent asked the proxy for {paths}, which it does not serve; under the "
            f"injected base URL it serves {served}, so the agent's "
            "client builds another path from it"
        )
    if findings.rejected:
        paths = ", ".join(
            sorted({f"{_where(findings, r)} ({r.status})" for r in findings.rejected})
        )
        lines.append(
            f"diagnosis: the proxy turned down {paths} before it became a model call: the body was "
            "not a JSON object, or was too large"
            + (
                ", or (415) was not sent with `Content-Type: application/json`"
                if any(r.status == 415 for r in findings.rejected)
                else ""
            )
        )
    if e.timed_out:
        lines.append(
            f"diagnosis: the agent ran past the {findings.timeout:g}s timeout without a model call "
            f"reaching the proxy{_stderr(e)}"
        )
    elif e.code != 0:
        how = f"was killed by signal {-e.code}" if e.code < 0 else f"exited with code {e.code}"
        lines.append(f"diagnosis: the agent {how} before reaching the proxy{_stderr(e)}")
    elif not lines:
        # A clean exit with no request at all: the client went elsewhere, or nowhere.
        lines.append(
            "diagnosis: the agent exited 0 without a model call, so its client never honoured "
            "OPENAI_BASE_URL (OpenAI clients) or ANTHROPIC_BASE_URL (Anthropic clients); if it "
            "reads another variable, set that "
            'one from them when it starts, e.g. command = ["sh", "-c", '
            '"MY_LLM_URL=$OPENAI_BASE_URL exec ./my-agent"], since the URL differs on every run'
        )
    return lines


def report(findings: Findings) -> tuple[list[str], int]:
    """The report's lines and the exit status."""
    settings = findings.agent.process
    lines = [
        f"agent: {shlex.join(settings.command)}" + (f" (in {settings.cwd})" if settings.cwd else "")
    ]
    lines += _traffic(findings)
    lines.append(_ending(findings))
    if findings.served:
        e = findings.ending
        if e.code not in (0, None) or e.timed_out:
            # The wiring works; the agent's own ending is its business, but
            # worth seeing: it may not have liked the canned reply.
            lines.append("note: the agent did not exit 0 after its calls" + _stderr(e))
        lines.append("ok: the agent's model calls reach salvor's proxy, so a run records them")
        return lines, EXIT_REACHED
    lines += _diagnosis(findings)
    return lines, EXIT_NOT_REACHED


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


def findings_json(findings: Findings, lines: list[str], code: int) -> dict[str, Any]:
    """``doctor --json``'s answer: what the text report says, as fields."""
    e = findings.ending
    return {
        "reached": code == EXIT_REACHED,
        "requests": [
            {
                # As the report names it: under the injected base URL, its capability prefix off.
                "request": _where(findings, r),
                "status": r.status,
                "wire": r.wire,
                "model": r.model,
                "stream": r.stream,
            }
            for r in findings.requests
        ],
        "process": {
            "exit_code": e.code,
            "timed_out": e.timed_out,
            "start_error": e.start_error,
        },
        "report": lines,
    }


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C, which trio may hand back wrapped in a nursery's exception group."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(KeyboardInterrupt) is not None
    return isinstance(exc, KeyboardInterrupt)
