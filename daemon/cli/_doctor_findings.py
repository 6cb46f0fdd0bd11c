"""What ``salvor doctor`` found (each request the agent sent its proxy, how the process ended)
and the report it makes of them: the text a person reads, and the same as fields (``--json``),
with the exit status they give."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ..agents import AgentDefinition
from ..proxies import ROUTES
from ._doctor_replies import CANNED

STDERR_LINES = 12


EXIT_REACHED, EXIT_NOT_REACHED, EXIT_USAGE = 0, 1, 2


@dataclass(slots=True)
class Request:
    """One HTTP request the agent sent the proxy, and what became of it."""

    method: str
    path: str
    status: int | None = None
    wire: str | None = None  # set when it was a model call doctor answered
    model: Any = None
    stream: bool = False


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
