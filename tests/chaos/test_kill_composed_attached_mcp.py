"""Kill safety of an MCP server attached at run time to composed runs: a real `salvor serve
--attachable-mcp FILE` keeps roots of run trees in flight, each of which the workload gives the
operator's server ``desk`` (``{"mcp_servers": ["desk"]}`` on ``POST /v1/runs/{id}/tools``) while
it waits on the workload, before it starts any child; the daemon is stopped at random instants
(``composed_harness``'s stops). ``desk`` is the fixture MCP server over streamable HTTP, outliving
every daemon: its ``write_note`` is a write keyed by its text, probed by ``find_note`` (a read of
the server's own ledger, which says whether the note landed).

The ``pilot`` agent declares no tool: it looks its tag up (``lookup``) and writes a note of it
(``write_note``), both the attached server's, offered because its run inherited the attachment.
The roots:

* a subagent tree: a ``delegator`` asks a question first (``ask_user``); the workload attaches
  ``desk`` and answers; its ``subagent`` calls then start a pilot for each of its 1-3 tags;
* a graph run: a ``gate`` first, at which the workload attaches ``desk`` and approves; then a
  ``map`` of pilot children (one per item), then a pilot agent node in the graph run itself.

The MCP path has no fault point of the daemon's (``SALVOR_FAULT_KILL_IN_TOOL`` names registry and
file tools): the kill inside a write is the server's instead. For that stop every note the script
asks for carries the fixture's ``hold``: the server performs the write (its ledger line) and holds
its answer back; the daemon is SIGKILLed once a held write is in the ledger, and the hold let go
to a dead daemon. The next daemon must probe the open write and record the note it finds.

Beyond ``ComposedLoad``'s invariants (logs contiguous and legal, each map item's child once,
nothing done by hand): no note was written twice in the server's ledger; every note a log
records done (by its call or by the probe) is the ledger's one, answered no error and copied no
other run's; every child's head inherited the attachment (``salvor.tools`` names ``mcp:desk``);
every root that started a child or wrote recorded the attachment first. At the end every note of
a tree that completed is in the ledger, and every tree completed, or rests with a write whose
probe could not tell parked for a person. At least one held write was settled by the probe.

CI runs the short schedule of the composed tests (14 stops on SQLite, 8 on PostgreSQL);
``SALVOR_CHAOS_KILLS=N`` asks for a longer run, ``SALVOR_CHAOS_SEED`` picks the seed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from salvor.protocol import TOOL_ERROR_KEY, EventKind
from salvor.store import EventStore

from tests.chaos.composed_harness import (
    SEED,
    WRITE_WAIT,
    ComposedLoad,
    Member,
    Root,
    run_composed,
)
from tests.chaos.test_kill_attached_mcp import DESK_TOKEN, TOKEN_VAR, attachable_file
from tests.chaos.test_kill_composed_attached import QUESTION, TOOLS_LABEL, attached_graph
from tests.chaos.test_kill_composed_skills import schedule
from tests.chaos.test_kill_serve import agent_toml, step_reply
from tests.support.mcp_servers import FixtureServer, HttpFixtureServer
from tests.support.scripted_provider import ProviderCall, Reply

pytestmark = pytest.mark.kill

SERVER = "desk"
ATTACHED = f"mcp:{SERVER}"
WRITE = "write_note"
FINAL_TEXT = "noted"


class ComposedAttachedMcp(ComposedLoad):
    """Trees whose children write notes through an MCP server attached to their root."""

    def __init__(self, tmp_path: Path, store_url: str, seed: int) -> None:
        # Read by the provider's threads (the script) from the first start on.
        self.hold: str | None = None  # the hold every note asked for now carries, if any
        fx_dir = tmp_path / "fx"
        fx_dir.mkdir()
        self.fx = FixtureServer(fx_dir)
        self.server = HttpFixtureServer(self.fx, "--find-note")
        try:
            super().__init__(tmp_path, store_url, seed, script=self.script)
        except BaseException:
            self.server.stop()
            raise
        self.daemon.env[TOKEN_VAR] = DESK_TOKEN
        self.daemon.args += [
            "--mcp-origin",
            f"http://127.0.0.1:{self.server.port},header_env={TOKEN_VAR}",
            "--attachable-mcp",
            str(attachable_file(tmp_path, self.server.url)),
        ]
        self.attached: set[str] = set()  # roots whose attachment was answered 200
        self.children = 0  # child runs found inheriting the attachment, at the end
        self.writes_cut: set[tuple[str, int]] = set()  # notes open at some stop
        self.held_kills = 0  # in-write stops that found a held write to kill in
        self.settled_by_probe = 0  # notes recorded done by the probe, at the end

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.server.stop()

    def script(self, call: ProviderCall) -> Reply:
        """A delegator asks, then starts a pilot for each of its tags; a pilot looks its tag up
        and writes a note of it (holding the server's answer while an in-write stop asks)."""
        work = json.loads(call.request["messages"][0]["content"][0]["text"])
        work = work.get("inputs", work)
        if "tags" in work:
            steps = [["ask_user", QUESTION]]
            steps += [
                ["subagent", {"agent": "pilot", "task": "note", "inputs": {"tag": tag}}]
                for tag in work["tags"].split()
            ]
        else:
            note = {"text": work["tag"]}
            if self.hold is not None:
                note["hold"] = self.hold
            steps = [["lookup", {"key": work["tag"]}], [WRITE, note]]
        return step_reply(call, steps, final=FINAL_TEXT)

    def register(self) -> None:
        base = self.provider.base_url
        hashes = []
        for toml in (
            agent_toml(base, "pilot", []),
            agent_toml(base, "delegator", [], ["subagent", "ask_user"]),
        ):
            response = self.http.post(
                "/v1/agents", content=toml, headers={"content-type": "application/toml"}
            )
            assert response.status_code == 201, response.text
            hashes.append(response.json()["agent"])
        pilot, self.agent = hashes
        response = self.http.post("/v1/graphs", json=attached_graph(pilot))
        assert response.status_code == 201, response.text
        self.graph = response.json()["graph"]

    def draw_root(self, case: str) -> Root:
        if self.rng.random() < 0.5:
            items = [{"tag": f"{case}-{i}"} for i in range(self.rng.randint(1, 3))]
            run_input = {"items": items, "extra": {"tag": f"{case}-x"}}
            return Root(case, "graph", run_input, answer={"approved": True})
        tags = " ".join(f"{case}-{i}" for i in range(self.rng.randint(1, 3)))
        run_input = {"task": "delegate", "inputs": {"tags": tags}}
        return Root(case, "tree", run_input, answer={"answer": "go"}, run_id=str(uuid.uuid4()))

    def answer(self, root: Root) -> None:
        """Attach the server (again after a stop: a server the run has records nothing), then
        answer; a root a drive still holds is tried on a later round."""
        body = {"mcp_servers": [SERVER]}
        response = self.call("POST", f"/v1/runs/{root.run_id}/tools", json=body)
        if response is None or response.status_code != 200:
            return
        self.attached.add(root.case)
        super().answer(root)

    # -- the kill inside a write ---------------------------------------------------------

    def stop(self, kind: str, rng) -> None:
        """The harness's stops; "in_write" is the server's hold (see the module)."""
        if kind != "in_write":
            super().stop(kind, rng)
            return
        name = f"stop-{self.tally.stops}"
        hold = self.hold = self.fx.hold(name)
        held = False
        try:
            deadline = time.monotonic() + WRITE_WAIT
            while not held and time.monotonic() < deadline:
                self.operate(top_up=True)
                held = any(c["arguments"].get("hold") == hold for c in self.fx.calls_of(WRITE))
                time.sleep(0.05)
            self.daemon.kill()
        finally:
            self.hold = None
            self.fx.release(name)  # the server answers a daemon that is gone
        if held:
            self.held_kills += 1
            self._stopped("SIGKILL in a note the server performed and holds the answer of", kind)
        else:
            self._stopped(f"SIGKILL after {WRITE_WAIT}s with no held note reached", "random")

    # -- the invariants ------------------------------------------------------------------

    def check_world(self) -> Counter:
        """The notes the server's ledger holds, by text; a note written twice is a violation."""
        notes = Counter(c["arguments"]["text"] for c in self.fx.calls_of(WRITE))
        for text, times in notes.items():
            if times > 1:
                self.violation(f"note {text} written {times} times")
        return notes

    def check_log(self, where: str, member: Member, view: Any, notes, *, final: bool) -> None:
        """A child inherited the attachment, a root recorded it before acting, and every note
        recorded done is the ledger's one."""
        log = member.log
        if member.parent is not None:
            labels = log[0].event.labels or {}
            if ATTACHED not in (labels.get(TOOLS_LABEL) or "").split(","):
                self.violation(f"{where}: its head's tools are {labels.get(TOOLS_LABEL)!r}")
            self.children += final
        else:
            self._check_root(where, log)
        pending = view.pending
        if pending is not None and pending.kind == "tool" and pending.tool == WRITE:
            self.writes_cut.add((member.run_id, pending.seq))
        done = {e.event.seq: e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED}
        for envelope in log:
            event = envelope.event
            if event.KIND is not EventKind.TOOL_CALL_REQUESTED or event.tool != WRITE:
                continue
            text, completion = event.input["text"], done.get(envelope.seq)
            if completion is None:
                continue
            output = completion.output
            if isinstance(output, dict) and TOOL_ERROR_KEY in output:
                self.violation(f"{where}: the note {text} answered {output[TOOL_ERROR_KEY]}")
            elif completion.deduplicated_from is not None:
                self.violation(f"{where}: the note {text} copied {completion.deduplicated_from}")
            elif notes[text] != 1:
                self.violation(
                    f"{where}: the note {text} is recorded done (settled by "
                    f"{completion.settled_by or 'its call'}) and the ledger holds {notes[text]}"
                )
            if completion.settled_by == "probe" and final:
                self.settled_by_probe += 1

    def _check_root(self, where: str, log: list) -> None:
        """Nothing a root did that needs ``desk`` came before its attachment was recorded."""
        attached = False
        for envelope in log:
            event = envelope.event
            if event.KIND is EventKind.TOOLS_ATTACHED:
                attached |= ATTACHED in event.tools
            acts = event.KIND is EventKind.MAP_ITEM_COMPLETED or (
                event.KIND is EventKind.TOOL_CALL_REQUESTED and event.tool in (WRITE, "subagent")
            )
            if acts and not attached:
                self.violation(f"{where}: seq {envelope.seq} acted with {SERVER} not attached")
                return

    def check_trees(self, *, final: bool = False) -> None:
        """``ComposedLoad``'s, and at the end: every note of a tree that completed is written."""
        super().check_trees(final=final)
        if not final:
            return
        notes = Counter(c["arguments"]["text"] for c in self.fx.calls_of(WRITE))
        for root in self.roots.values():
            if root.case not in self.final:
                continue
            if root.kind == "tree":
                tags = root.input["inputs"]["tags"].split()
            else:
                tags = [entry["tag"] for entry in [*root.input["items"], root.input["extra"]]]
            for tag in tags:
                if notes[tag] != 1:
                    self.violation(f"{root.kind} {root.case} completed, {tag} noted {notes[tag]}")

    def parked_for_a_person(self, store: EventStore, run_id: str, view: Any) -> bool:
        """Parked on a note whose probe could not tell."""
        pending = view.pending
        if pending is None or pending.kind != "tool" or pending.tool != WRITE:
            return False
        seq = pending.seq
        answer = store.claims.probe_answers([(run_id, seq)]).get((run_id, seq))
        return answer is not None and answer.verdict == "unknown"

    def what_pending(self, run_id: str, pending: Any) -> str:
        if pending.kind == "tool" and pending.tool == WRITE:
            text = pending.input["text"]
            written = [c for c in self.fx.calls_of(WRITE) if c["arguments"]["text"] == text]
            return f"the server's ledger holds {len(written)} note(s) {text}"
        return ""

    def figures(self, began: float) -> dict:
        figures = super().figures(began)
        figures["roots_attached"] = len(self.attached)
        figures["children_inheriting"] = self.children
        figures["notes_cut_open"] = len(self.writes_cut)
        figures["kills_in_a_held_note"] = self.held_kills
        figures["notes_settled_by_probe"] = self.settled_by_probe
        return figures


def test_an_mcp_server_attached_to_composed_runs_killed_at_random_instants_writes_once(
    tmp_path: Path, store_url: str
) -> None:
    began = time.monotonic()
    kinds, kills, seconds = schedule(store_url)
    harness = ComposedAttachedMcp(tmp_path, store_url, SEED)
    try:
        run_composed(harness, kinds, kills=kills, seconds=seconds)
    finally:
        harness.close()
    figures = harness.figures(began)
    print("composed attached MCP chaos:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert figures["children_inheriting"] > 0, figures
    assert figures["kills_in_a_held_note"] > 0, figures
    assert figures["notes_settled_by_probe"] > 0, figures
    assert all(figures["kills_by_kind"].get(kind) for kind in ("random", "double", "in_write"))
