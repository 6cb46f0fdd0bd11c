"""The one table of record-and-replay cases, in terms every user of the rules can render.

A case is a run's own recorded calls (and a re-run's origin's), how many of
them the drive has answered so far, and either the call it makes next or the
end of the drive. A call is abstract: a kind ("model" or "tool"), a request
name, an effect for a tool, completed or open. Each user renders it in its own
log shape (the built-in loop's model and tool calls, the proxy's model calls,
an MCP lane's requests) and must reach the same step, the same divergence
details and the same shortfall; ``tests/protocol/test_replay_engine.py`` and
``tests/daemon/proxies/test_replay_users.py`` run it.

Seqs: every rendering puts ``RunStarted`` at seq 0 and each call's intent and
completion right after the previous call's, so the call at index i has its
intent at seq 1 + 2i, in the run's log and in the origin's alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from salvor.protocol import DivergenceReason, Step

ORIGIN = "run-origin"


@dataclass(frozen=True)
class Call:
    request: str
    kind: str = "model"
    effect: str | None = None
    done: bool = True


def tool(request: str, effect: str = "read", *, done: bool = True) -> Call:
    return Call(request, "tool", effect, done)


@dataclass(frozen=True)
class Case:
    name: str
    log: tuple[Call, ...]
    # How many calls the drive has answered (the lane's position).
    answered: int
    # The call the drive makes next; None: the drive ends here.
    live: Call | None
    step: Step | None = None
    reason: DivergenceReason | None = None
    # The divergence's seq (the recorded call's, or the open intent's).
    seq: int | None = None
    origin: tuple[Call, ...] | None = None
    # Another boundary's intent is open at this seq (only a lane has other boundaries).
    open_elsewhere: int | None = None
    # A fragment of the divergence's or the shortfall's message; {one}/{many}: the user's nouns.
    says: str | None = None


def intent_seq(index: int) -> int:
    return 1 + 2 * index


A, B = Call("a"), Call("b")
CASES = [
    Case("a completed call that matches is answered from the log", (A, B), 1, B, Step.ANSWER),
    Case("a call past the end goes live", (A,), 1, B, Step.LIVE),
    Case("an empty log goes live at once", (), 0, A, Step.LIVE),
    Case(
        "a request other than the recorded one diverges",
        (A, B),
        1,
        Call("c"),
        Step.DIVERGED,
        DivergenceReason.REQUEST,
        seq=3,
        says="{one} 2 (recorded at seq 3) differs from the recording: ",
    ),
    Case(
        "another kind of call than the recorded one diverges",
        (A, tool("q")),
        1,
        B,
        Step.DIVERGED,
        DivergenceReason.KIND,
        seq=3,
    ),
    Case("a dangling model call is issued again", (A, Call("b", done=False)), 1, B, Step.REISSUE),
    Case(
        "a dangling read is executed again", (A, tool("q", done=False)), 1, tool("q"), Step.REISSUE
    ),
    Case(
        "a dangling idempotent call is executed again under its key",
        (A, tool("q", "idempotent", done=False)),
        1,
        tool("q", "idempotent"),
        Step.REISSUE,
    ),
    Case(
        "a dangling write parks the run",
        (A, tool("q", "write", done=False)),
        1,
        tool("q", "write"),
        Step.PARK,
    ),
    Case(
        "a dangling call that differs diverges, whatever its effect",
        (A, tool("q", "write", done=False)),
        1,
        tool("r", "write"),
        Step.DIVERGED,
        DivergenceReason.REQUEST,
        seq=3,
    ),
    Case(
        "a re-run reproduces its origin's call past its own log",
        (A,),
        1,
        B,
        Step.REPRODUCE,
        origin=(A, B),
    ),
    Case(
        "a re-run answers its own log before its origin's", (A,), 0, A, Step.ANSWER, origin=(A, B)
    ),
    Case(
        "a re-run that asks beyond its origin's end diverges",
        (A,),
        1,
        B,
        Step.DIVERGED,
        DivergenceReason.BEYOND_END,
        origin=(A,),
        says="{one} 2 has no counterpart: origin run run-origin recorded only 1 {many}; the agent ",
    ),
    Case(
        "a re-run whose origin's call differs diverges over the origin's call",
        (),
        0,
        Call("c"),
        Step.DIVERGED,
        DivergenceReason.REQUEST,
        seq=1,
        origin=(A,),
        says="{one} 1 (recorded by origin run run-origin at seq 1)",
    ),
    Case(
        "a re-run cannot answer a call its origin never completed",
        (),
        0,
        A,
        Step.DIVERGED,
        DivergenceReason.NEVER_COMPLETED,
        seq=1,
        origin=(Call("a", done=False),),
        says="{one} 1 (recorded by origin run run-origin at seq 1) never completed, so a re-run ",
    ),
    Case(
        "a new call past the end while another boundary's intent is open diverges",
        (A,),
        1,
        B,
        Step.DIVERGED,
        DivergenceReason.OPEN_ELSEWHERE,
        seq=7,
        open_elsewhere=7,
        says="call recorded open at seq 7 was not made again",
    ),
    Case(
        "an open intent elsewhere does not stop a call the log answers",
        (A,),
        0,
        A,
        Step.ANSWER,
        open_elsewhere=7,
    ),
    Case("a drive that made every recorded call falls short of nothing", (A, B), 2, None),
    Case(
        "a recovered drive that ends early falls short",
        (A, B),
        1,
        None,
        says="ended after 1 of the 2 recorded {many}; a recovered run must make every recorded",
    ),
    Case(
        "a re-run that ends before its origin's end falls short",
        (A,),
        1,
        None,
        origin=(A, B, B),
        says="ended after 1 of the 3 {many} origin run run-origin recorded; a re-run must make",
    ),
    Case("a re-run that made every origin call falls short of nothing", (), 2, None, origin=(A, B)),
]


def ids(cases: list[Case]) -> list[str]:
    return [case.name for case in cases]
