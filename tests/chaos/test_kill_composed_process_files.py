"""Kill safety of a process agent's file writes in composed runs: a real `salvor serve
--workspace DIR --allow-process-agents` keeps subagent trees in flight whose children are
process agents (the ``mcp`` SDK stand-in script) writing through the ``salvor`` MCP server, and
is stopped at random instants (``composed_harness``'s stops, a kill inside an ``edit`` or a
``write`` after the file changed among them).

A root is a built-in ``delegator`` whose ``subagent`` calls start one ``clerk`` child for each
of its 1-3 leaves. The clerk is a process agent, and does two things in order:

* ``edit`` its own file ``notes/edits/LEAF.md`` (the workload wrote ``# LEAF``), appending the
  line ``edited by LEAF``: applied exactly once, or the line is there twice;
* ``write`` its own file ``notes/writes/LEAF.md`` with ``written by LEAF``.

A killed child's process is started again by the next daemon and answered from its log up to
its open call; an open write is probed by the plan its intent carries. Nothing here changes a
file behind a write's back, so no write has a reason to wait for a person.

Beyond ``ComposedLoad``'s invariants (logs contiguous and legal, nothing by hand), after every
stop and at the end: each edited file holds its first line alone or with its appended line once;
each written file is absent or holds its content; each child's log records each of its writes
at most once, and every write it records done answered no error and its file holds the intended
content; every child of a tree runs under the id its parent's call derives (no run names the
parent that is not one of those), and a subagent call recorded done found its child completed.
At the end every tree completed and every leaf edited and wrote.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from salvor.daemon.flows import PARENT_LABEL, child_run_id
from salvor.daemon.proxies._mcp_lane import call_failed
from salvor.protocol import EventKind, RunState
from salvor.store import EventStore

from tests.chaos.composed_harness import SEED, ComposedLoad, Member, Root, run_composed
from tests.chaos.test_kill_serve import agent_toml, step_reply
from tests.daemon.agents.test_process_agent import SECRET
from tests.daemon.files.test_process_file_tools import _process_agent
from tests.support.scripted_provider import ProviderCall, Reply

pytestmark = pytest.mark.kill

FILE_TOOLS = ("edit", "write")
SALVOR_CALL = "mcp:salvor/tools/call"
# A kill in a write: inside an edit or a write after the file changed (recovery probes it).
WRITE_POINTS = (("edit", 1), ("write", 1))
# Shorter than ``kill_schedule``'s: every child is a process (a Python with the mcp SDK) on two
# cores, started again at every recovery. SQLite: 8 stops, 11 SIGKILLs; PostgreSQL: 4 and 6.
SQLITE_STOPS = ["random"] * 3 + ["sigterm", "double", "in_write", "in_write", "random"]
POSTGRES_STOPS = ["random", "double", "in_write", "random"]


def first_line(leaf: str) -> str:
    return f"# {leaf}\n"


def edited(leaf: str) -> str:
    return f"# {leaf}\nedited by {leaf}\n"


def written(leaf: str) -> str:
    return f"written by {leaf}\n"


def files_script(call: ProviderCall) -> Reply:
    """One tool call per answer, read from the run's first message: a delegator starts a clerk
    child for each of its leaves; a clerk (through the daemon's model proxy) edits and writes
    its leaf's files."""
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
            ["edit", {"path": f"notes/edits/{leaf}.md", **append}],
            ["write", {"path": f"notes/writes/{leaf}.md", "content": written(leaf)}],
        ]
    return step_reply(call, steps, final="filed")


def lane_write(event: Any) -> tuple[str, str] | None:
    """The tool and leaf of a ``salvor`` lane write or edit intent (None for another event)."""
    if event.KIND is not EventKind.TOOL_CALL_REQUESTED or event.tool != SALVOR_CALL:
        return None
    if event.input.get("name") not in FILE_TOOLS:
        return None
    return event.input["name"], Path(event.input["arguments"]["path"]).stem


class ComposedProcessFiles(ComposedLoad):
    """Process-agent clerks' edits and writes in subagent trees."""

    write_points = WRITE_POINTS
    # Each child is a process (a Python importing the mcp SDK), and a recovery starts every
    # interrupted one again at once: on two cores, six trees' worth took longer to come back
    # than the settling waits on a quiet daemon.
    in_flight_roots = 4

    def __init__(self, tmp_path: Path, store_url: str, seed: int) -> None:
        super().__init__(tmp_path, store_url, seed, script=files_script)
        self.tmp_path = tmp_path
        self.workspace = tmp_path / "ws"
        for folder in ("edits", "writes"):
            (self.workspace / "notes" / folder).mkdir(parents=True)
        self.leaves: dict[str, list[str]] = {}  # root -> its leaves
        self.probed: Counter = Counter()  # tool -> writes settled by their probe
        self.daemon.allow_process_agents()
        self.daemon.args += ["--workspace", str(self.workspace)]
        self.daemon.env.update(SALVOR_AGENT_UPSTREAM=self.provider.base_url,
                               SALVOR_AGENT_KEY=SECRET)  # fmt: skip
        self.http.headers.update(self.daemon.headers)

    def register(self) -> None:
        hashes = []
        for toml in (
            _process_agent(self.tmp_path, list(FILE_TOOLS)),
            agent_toml(self.provider.base_url, "delegator", [], ["subagent"]),
        ):
            response = self.http.post(
                "/v1/agents", content=toml, headers={"content-type": "application/toml"}
            )
            assert response.status_code == 201, response.text
            hashes.append(response.json()["agent"])
        self.agent = hashes[1]

    def draw_root(self, case: str) -> Root:
        leaves = [f"{case}-{i}" for i in range(self.rng.randint(1, 3))]
        for leaf in leaves:
            (self.workspace / "notes" / "edits" / f"{leaf}.md").write_text(first_line(leaf))
        self.leaves[case] = leaves
        run_input = {"task": "delegate", "inputs": {"leaves": " ".join(leaves)}}
        return Root(case, "tree", run_input, run_id=str(uuid.uuid4()))

    def _file(self, tool: str, leaf: str) -> tuple[Path, str]:
        """A leaf's file of ``tool`` and what the tool means it to hold."""
        folder, intended = ("edits", edited) if tool == "edit" else ("writes", written)
        return self.workspace / "notes" / folder / f"{leaf}.md", intended(leaf)

    def check_world(self) -> dict[str, str]:
        """Each leaf's files hold what a call meant at most once; returns the parent each run
        of the store names (children are found by the label their parent's call gave them)."""
        for leaf in (leaf for leaves in self.leaves.values() for leaf in leaves):
            edit = (self.workspace / "notes" / "edits" / f"{leaf}.md").read_text()
            if edit not in (first_line(leaf), edited(leaf)):
                self.violation(f"edits/{leaf}.md holds {edit!r}")
            write, intended = self._file("write", leaf)
            if write.exists() and write.read_text() != intended:
                self.violation(f"writes/{leaf}.md holds {write.read_text()!r}")
        parents = {}
        with EventStore.open(self.store_url) as store:
            for root in self.roots.values():
                if root.run_id is None:
                    continue
                summaries, _ = store.list_runs(label=(PARENT_LABEL, root.run_id))
                parents.update({summary.run_id: root.run_id for summary in summaries})
        return parents

    def check_log(
        self, where: str, member: Member, view: Any, parents: dict[str, str], *, final: bool
    ) -> None:
        if member.parent is None:
            self._check_children(where, member, parents)
            return
        done = {
            e.event.seq: e.event
            for e in member.log
            if e.event.KIND is EventKind.TOOL_CALL_COMPLETED
        }
        recorded = Counter()
        for envelope in member.log:
            call = lane_write(envelope.event)
            if call is None:
                continue
            recorded[call] += 1
            completion = done.get(envelope.seq)
            if completion is None:
                continue
            tool, leaf = call
            self.probed[tool] += final and completion.settled_by == "probe"
            path, intended = self._file(tool, leaf)
            held = path.read_text() if path.exists() else None
            if call_failed(completion.output):
                self.violation(f"{where}: the {tool} of {leaf} answered {completion.output}")
            elif held != intended:
                self.violation(f"{where}: the {tool} of {leaf} is done and its file holds {held!r}")
        for (tool, leaf), times in recorded.items():
            if times > 1:
                self.violation(f"{where}: the {tool} of {leaf} is recorded {times} times")

    def _check_children(self, where: str, member: Member, parents: dict[str, str]) -> None:
        """The parent's children are the runs its subagent calls derive, and a call recorded
        done found its child completed."""
        derived, done = {}, set()
        for envelope in member.log:
            event = envelope.event
            if event.KIND is EventKind.TOOL_CALL_REQUESTED and event.tool == "subagent":
                derived[envelope.seq] = child_run_id(member.run_id, envelope.seq)
            elif event.KIND is EventKind.TOOL_CALL_COMPLETED and event.seq in derived:
                done.add(event.seq)
        named = {run for run, parent in parents.items() if parent == member.run_id}
        for stray in sorted(named - set(derived.values())):
            self.violation(f"{where}: run {stray} names it its parent, under no call's id")
        with EventStore.open(self.store_url) as store:
            for seq in sorted(done):
                child = store.read_view(derived[seq])
                if child is None or child.state is not RunState.COMPLETED:
                    state = child.state.value if child else "no log"
                    self.violation(f"{where}: its subagent call at {seq} is done, child {state}")

    def _quiet(self) -> bool:
        """No run of any tree is driven, at a gate or asleep: a parent waits on its child with
        no drive of its own, while the child's process works (or is started again)."""
        for status in ("running", "suspended", "sleeping"):
            # Every run, children too (they carry none of their root's labels).
            response = self.call("GET", "/v1/runs", params={"status": status})
            if response is None:
                return False
            assert response.status_code == 200, response.text
            listed = response.json()["runs"]
            if any(status != "running" or run.get("driver") != "none" for run in listed):
                return False
        return True

    def settle(self) -> None:
        """The end, and then: every leaf of a tree that completed edited and wrote."""
        super().settle()
        for case in self.final:
            for leaf in self.leaves[case]:
                for tool in FILE_TOOLS:
                    path, intended = self._file(tool, leaf)
                    held = path.read_text() if path.exists() else None
                    if held != intended:
                        root = self.roots[case]
                        self.violation(f"tree {case} ({root.run_id}) completed, and the {tool} "
                                       f"of {leaf} left {held!r}")  # fmt: skip

    def figures(self, began: float) -> dict:
        figures = super().figures(began)
        figures["leaves"] = sum(map(len, self.leaves.values()))
        figures["settled_by_probe"] = dict(self.probed)
        return figures


def test_process_agents_writes_in_subagent_trees_killed_at_random_instants_land_once(
    tmp_path: Path, store_url: str
) -> None:
    began = time.monotonic()
    kinds = SQLITE_STOPS if store_url.startswith("sqlite") else POSTGRES_STOPS
    kills = len(kinds) + kinds.count("double") + kinds.count("in_write")
    harness = ComposedProcessFiles(tmp_path, store_url, SEED)
    try:
        run_composed(harness, kinds, kills=kills, seconds=300)
    finally:
        harness.close()
    figures = harness.figures(began)
    print("composed process file tools chaos:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert figures["unsettled_after_30s"] == [], figures["unsettled_after_30s"]
    assert all(figures["kills_by_kind"].get(kind) for kind in ("random", "double", "in_write"))
    # A kill inside a write lands after its effect: the next daemon's probe settled it.
    assert sum(figures["settled_by_probe"].values()) >= 1, figures
