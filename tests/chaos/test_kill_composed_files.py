"""Kill safety of the file and shell tools in composed runs: a real `salvor serve --workspace DIR
--allow-bash` keeps roots of run trees in flight whose leaves edit, write and run a command, and
is stopped at random instants (``composed_harness``'s stops, a kill in an ``edit``, a ``write``
or a ``bash`` among them).

Each leaf is one ``clerk`` run named by a leaf id of its own, and does three things in order:

* ``edit`` its own file ``edits/LEAF.md`` (the workload wrote ``# LEAF``), appending the line
  ``edited by LEAF``: applied exactly once, or the line is there twice;
* ``write`` its own file ``writes/LEAF.md`` with ``written by LEAF``;
* ``bash`` ``echo LEAF >> LEDGER``, the ledger a file outside the workspace named in the command.

The roots: a subagent tree (a ``delegator`` whose ``subagent`` calls start a clerk for each of
its 1-3 leaves; a child session is offered no ``subagent``, so a tree is one level deep); a graph
run whose ``map`` items are clerks (one child
per item) followed by a clerk agent node in the graph run itself (its calls in the graph run's
own log).

Beyond ``ComposedLoad``'s invariants (logs contiguous and legal, each map item's child finished
once, nothing by hand), after every stop and at the end: each edited file holds its first line
alone or with its appended line once; each written file is absent or holds its content; no
ledger marker appears twice; every edit, write and bash a log records done answered no error
and its file holds the intended content (its marker is in the ledger once): no write of a
completed call is lost. At the end every leaf of a tree that completed edited, wrote and ran
its command, and every tree completed, or rests with a ``bash`` left open (parked for a person
on its recorded write intent, as the reconciliation queue shows it; a command is never run again
by itself) and its tree's other unfinished runs waiting on it.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from salvor.protocol import TOOL_ERROR_KEY, EventKind
from salvor.store import EventStore

from tests.chaos.composed_harness import (
    MAP_NODE,
    SEED,
    ComposedLoad,
    Member,
    Root,
    kill_schedule,
    run_composed,
)
from tests.chaos.test_kill_serve import TOKEN_VAR, agent_toml, step_reply
from tests.support.scripted_provider import ProviderCall, Reply

pytestmark = pytest.mark.kill

FILE_TOOLS = ("edit", "write", "bash")
# A kill in a write: inside an edit or a write after the file changed (recovery probes it), or
# inside a bash after the command ran (the run parks for a person).
WRITE_POINTS = (("edit", 3), ("write", 3), ("bash", 2))


def first_line(leaf: str) -> str:
    return f"# {leaf}\n"


def edited(leaf: str) -> str:
    return f"# {leaf}\nedited by {leaf}\n"


def written(leaf: str) -> str:
    return f"written by {leaf}\n"


def leaf_of(tool_input: dict) -> str:
    """The leaf a file tool call acts for (its path's stem, or its command's marker)."""
    if "path" in tool_input:
        return Path(tool_input["path"]).stem
    return tool_input["command"].split()[1]


def files_script(ledger: Path, call: ProviderCall) -> Reply:
    """One tool call per answer, read from the run's first message: a clerk edits, writes and
    marks the ledger for its leaf; a delegator starts a clerk child for each of its leaves."""
    work = json.loads(call.request["messages"][0]["content"][0]["text"])
    work = work.get("inputs", work)  # a subagent child's input: its task and its inputs
    if "leaves" in work:
        steps = [
            ["subagent", {"agent": "clerk", "task": "file", "inputs": {"leaf": leaf}}]
            for leaf in work["leaves"].split()
        ]
    else:
        leaf = work["leaf"]
        append = {"old_text": first_line(leaf), "new_text": edited(leaf)}
        steps = [
            ["edit", {"path": f"edits/{leaf}.md", **append}],
            ["write", {"path": f"writes/{leaf}.md", "content": written(leaf)}],
            ["bash", {"command": f"echo {leaf} >> {ledger}"}],
        ]
    return step_reply(call, steps, final="filed")


def files_graph(clerk: str) -> dict:
    """A clerk child per item, then a clerk agent node in the graph run itself."""
    return {
        "schema_version": 1,
        "nodes": [
            {
                "id": MAP_NODE,
                "kind": "map",
                "over": "$input.items",
                "concurrency": 2,
                "body": {"kind": "agent", "agent": clerk, "input": "$item"},
            },
            {"id": "extra", "kind": "agent", "agent": clerk, "input": "$input.extra"},
        ],
        "edges": [{"from": MAP_NODE, "to": "extra"}],
    }


class ComposedFiles(ComposedLoad):
    """Clerks' edits, writes and commands in subagent trees and graph runs."""

    write_points = WRITE_POINTS

    def __init__(self, tmp_path: Path, store_url: str, seed: int) -> None:
        self.marks = tmp_path / "bash-ledger.txt"  # outside the workspace
        super().__init__(tmp_path, store_url, seed, script=lambda c: files_script(self.marks, c))
        self.workspace = tmp_path / "ws"
        for folder in ("edits", "writes"):
            (self.workspace / folder).mkdir(parents=True)
        self.leaves: dict[str, list[str]] = {}  # root -> its leaves
        self.parked_bash = 0  # bash calls found parked at the end
        self.probed: Counter = Counter()  # tool -> edits and writes settled by their probe
        token = secrets.token_urlsafe(24)
        self.daemon.env[TOKEN_VAR] = token
        self.daemon.args += ["--workspace", str(self.workspace), "--allow-bash",
                             "--auth-token", TOKEN_VAR]  # fmt: skip
        self.http.headers["Authorization"] = f"Bearer {token}"

    def register(self) -> None:
        base = self.provider.base_url
        clerk = agent_toml(base, "clerk", FILE_TOOLS).replace(
            "max_response_tokens", 'access = { write = ["**"] }\nmax_response_tokens', 1
        )
        hashes = []
        for toml in (clerk, agent_toml(base, "delegator", [], ["subagent"])):
            response = self.http.post(
                "/v1/agents", content=toml, headers={"content-type": "application/toml"}
            )
            assert response.status_code == 201, response.text
            hashes.append(response.json()["agent"])
        clerk_hash, self.agent = hashes
        response = self.http.post("/v1/graphs", json=files_graph(clerk_hash))
        assert response.status_code == 201, response.text
        self.graph = response.json()["graph"]

    def draw_root(self, case: str) -> Root:
        if self.rng.random() < 0.5:
            leaves = [f"{case}-{i}" for i in range(self.rng.randint(1, 3))]
            items = [{"leaf": leaf} for leaf in leaves]
            run_input = {"items": items, "extra": {"leaf": f"{case}-x"}}
            root = Root(case, "graph", run_input)
            leaves.append(f"{case}-x")
        else:
            leaves = [f"{case}-{i}" for i in range(self.rng.randint(1, 3))]
            run_input = {"task": "delegate", "inputs": {"leaves": " ".join(leaves)}}
            root = Root(case, "tree", run_input, run_id=str(uuid.uuid4()))
        for leaf in leaves:
            (self.workspace / "edits" / f"{leaf}.md").write_text(first_line(leaf))
        self.leaves[case] = leaves
        return root

    def check_world(self) -> Counter:
        """Each leaf's files hold what a call meant at most once; no marker is there twice.
        Returns the ledger's markers."""
        marks = Counter(self.marks.read_text().split() if self.marks.exists() else [])
        for leaf, times in marks.items():
            if times > 1:
                self.violation(f"the command of {leaf} ran {times} times")
        for leaf in (leaf for leaves in self.leaves.values() for leaf in leaves):
            edit = (self.workspace / "edits" / f"{leaf}.md").read_text()
            if edit not in (first_line(leaf), edited(leaf)):
                self.violation(f"edits/{leaf}.md holds {edit!r}")
            write = self.workspace / "writes" / f"{leaf}.md"
            if write.exists() and write.read_text() != written(leaf):
                self.violation(f"writes/{leaf}.md holds {write.read_text()!r}")
        return marks

    def check_log(
        self, where: str, member: Member, view: Any, marks: Counter, *, final: bool
    ) -> None:
        """Every file call the log records done answered no error and its effect is there."""
        pending = view.pending
        if pending is not None and pending.kind == "tool" and pending.tool == "bash":
            self.parked_bash += final
        done = {
            e.event.seq: e.event
            for e in member.log
            if e.event.KIND is EventKind.TOOL_CALL_COMPLETED
        }
        for envelope in member.log:
            event = envelope.event
            if event.KIND is not EventKind.TOOL_CALL_REQUESTED or event.tool not in FILE_TOOLS:
                continue
            completion = done.get(envelope.seq)
            if completion is None or completion.settled_by == "operator":
                continue
            leaf = leaf_of(event.input)
            self.probed[event.tool] += final and completion.settled_by == "probe"
            what = f"{where}: the {event.tool} of {leaf}"
            output = completion.output
            if isinstance(output, dict) and TOOL_ERROR_KEY in output:
                self.violation(f"{what} answered an error: {output[TOOL_ERROR_KEY]}")
            elif completion.deduplicated_from is not None:
                self.violation(f"{what} copied another run's ({completion.deduplicated_from})")
            elif event.tool == "bash" and marks[leaf] != 1:
                self.violation(f"{what} is recorded done and the ledger holds {marks[leaf]}")
            elif event.tool != "bash":
                folder, intended = (
                    ("edits", edited) if event.tool == "edit" else ("writes", written)
                )
                path = self.workspace / folder / f"{leaf}.md"
                held = path.read_text() if path.exists() else None
                if held != intended(leaf):
                    self.violation(f"{what} is recorded done and its file holds {held!r}")

    def settle(self) -> None:
        """The end, and then: every leaf of a tree that completed edited, wrote and ran."""
        super().settle()
        marks = self.check_world()
        for case in self.final:
            for leaf in self.leaves[case]:
                edit = (self.workspace / "edits" / f"{leaf}.md").read_text()
                write = self.workspace / "writes" / f"{leaf}.md"
                if edit != edited(leaf) or not write.exists() or marks[leaf] != 1:
                    root = self.roots[case]
                    self.violation(f"{root.kind} {case} ({root.run_id}) completed, and "
                                   f"{leaf} left {edit!r}, {write.exists()=}, "
                                   f"{marks[leaf]} marks")  # fmt: skip

    def parked_for_a_person(self, store: EventStore, run_id: str, view: Any) -> bool:
        """Parked on a ``bash`` left open: its write intent the log's last word (what the
        reconciliation queue shows a person)."""
        pending = view.pending
        return pending.kind == "tool" and pending.tool == "bash" and pending.effect == "write"

    def figures(self, began: float) -> dict:
        figures = super().figures(began)
        figures["leaves"] = sum(map(len, self.leaves.values()))
        figures["commands_parked_at_the_end"] = self.parked_bash
        figures["settled_by_probe"] = dict(self.probed)
        return figures


def test_file_tools_in_composed_runs_killed_at_random_instants_land_once(
    tmp_path: Path, store_url: str
) -> None:
    began = time.monotonic()
    kinds, kills = kill_schedule(store_url.startswith("sqlite"), SEED)
    harness = ComposedFiles(tmp_path, store_url, SEED)
    try:
        run_composed(harness, kinds, kills=kills, seconds=600)
    finally:
        harness.close()
    figures = harness.figures(began)
    print("composed file tools chaos:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert all(figures["kills_by_kind"].get(kind) for kind in ("random", "double", "in_write"))
