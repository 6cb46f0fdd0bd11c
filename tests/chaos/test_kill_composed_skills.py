"""Kill safety of skills in composed runs: a real `salvor serve --skills-dir DIR` keeps roots of
run trees in flight whose agents declare a skill, is stopped at random instants
(``composed_harness``'s stops), and between every two stops, while no daemon runs, the skill's
SKILL.md is given a new description (an edition of its own).

The ``pilot`` agent declares the skill ``tide-tables``: it reads the skill's SKILL.md, looks its
tag up (``lookup_invoice``) and answers. The roots:

* a subagent tree: a ``delegator``, which declares the skill too, starts a pilot child for each
  of its 1-3 tags (``subagent``);
* a graph run: a ``map`` of pilot children (one per item), then a pilot agent node in the graph
  run itself.

The harness's kill in a write lands in a pilot's lookup (``lookup_invoice``'s fault point: its
skills resolved and its first model call made), or right after a run recorded its skills, before
its first model call (``SALVOR_FAULT_KILL_AFTER_SEQ``, a small hook of the harness: ``fault``);
either way the run is recovered by a daemon that reads the next edition.

Beyond ``ComposedLoad``'s invariants (logs contiguous and legal, each map item's child once,
nothing done by hand, every tree completed at the end): every run whose agent declares the skill
resolved it once, before its first model call; the description its ``resolve_skills`` read
recorded is the edition on disk when that read was recorded (a run started after a change sees
the change); and every model request the scripted provider saw for it, before and after any
restart, advertises that description and no other (a recovered run keeps its prompt). At least
one run kept its edition across a change, and at least one recorded a later edition.

CI runs the short schedule of the composed tests (14 stops on SQLite, 8 on PostgreSQL);
``SALVOR_CHAOS_KILLS=N`` asks for a longer run, ``SALVOR_CHAOS_SEED`` picks the seed.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from salvor.protocol import EventKind

from tests.chaos.composed_harness import (
    MAP_NODE,
    SEED,
    ComposedLoad,
    Member,
    Root,
    kill_schedule,
    run_composed,
)
from tests.chaos.test_kill_serve import agent_toml, step_reply
from tests.support.scripted_provider import ProviderCall, Reply

pytestmark = pytest.mark.kill

SKILL = "tide-tables"
RESOLVE = "resolve_skills"
FINAL_TEXT = "tides read"
# A kill in a write's other instant: the daemon dies as a run's skills are recorded, before its
# first model call (``fault``), so the daemon that recovers it reads the next edition.
RESOLVED = "resolved"
AFTER_SEQ_VAR = "SALVOR_FAULT_KILL_AFTER_SEQ"
_ADVERTISED = re.compile(r"<description>(.*?)</description>")


def edition(k: int) -> str:
    """The skill's description in its k-th edition (0: as first written)."""
    return f"Tide tables for the harbour, edition {k}."


def work_of(call: ProviderCall) -> dict:
    """What a run was asked to do: its first message (a subagent child's: its ``inputs``)."""
    work = json.loads(call.request["messages"][0]["content"][0]["text"])
    return work.get("inputs", work)


def skills_script(call: ProviderCall) -> Reply:
    """A delegator starts a pilot for each of its tags; a pilot reads its skill, looks its tag
    up and answers."""
    work = work_of(call)
    if "tags" in work:
        skill = work["skill"]
        steps = [
            ["subagent", {"agent": "pilot", "task": "tides", "inputs": {"tag": t, "skill": skill}}]
            for t in work["tags"].split()
        ]
    else:
        steps = [["read", {"path": work["skill"]}], ["lookup_invoice", {"invoice_id": work["tag"]}]]
    return step_reply(call, steps, final=FINAL_TEXT)


def advertised(call: ProviderCall) -> list[str]:
    """The skill descriptions a model request's system prompt advertises."""
    return _ADVERTISED.findall(json.dumps(call.request.get("system")))


def skills_graph(pilot: str) -> dict:
    """A map of pilot children over the items, then a pilot node in the graph run itself."""
    return {
        "schema_version": 1,
        "nodes": [
            {
                "id": MAP_NODE,
                "kind": "map",
                "over": "$input.items",
                "concurrency": 2,
                "body": {"kind": "agent", "agent": pilot, "input": "$item"},
            },
            {"id": "extra", "kind": "agent", "agent": pilot, "input": "$input.extra"},
        ],
        "edges": [{"from": MAP_NODE, "to": "extra"}],
    }


def recorded_at(envelope: Any) -> float:
    return datetime.fromisoformat(envelope.recorded_at).timestamp()


class ComposedSkills(ComposedLoad):
    """Trees of runs declaring a skill whose description changes between stops."""

    write_points = (("lookup_invoice", 1), (RESOLVED, 2))

    def __init__(self, tmp_path: Path, store_url: str, seed: int) -> None:
        # The provider's threads note each request's edition from the first start on.
        self.editions: list[float] = []  # edition k -> when it was written (the epoch's clock)
        self.served_in: dict[int, int] = {}  # provider request index -> the edition on disk
        super().__init__(tmp_path, store_url, seed, script=skills_script)
        self.skill_md = tmp_path / "skills" / SKILL / "SKILL.md"
        self.skill_md.parent.mkdir(parents=True)
        self.write_edition()
        self.location = str(self.skill_md.resolve())
        self.daemon.args += ["--skills-dir", str(tmp_path / "skills")]
        self.kept_across = 0  # runs whose requests straddle a change, at the end
        self.later_edition = 0  # runs that recorded an edition after the first, at the end
        self.skilled_runs = 0
        self.points_drawn: Counter = Counter()  # the in-write stops' fault points, as drawn

    def write_edition(self) -> None:
        """The skill's next edition (written while no daemon runs)."""
        k = len(self.editions)
        text = f"---\nname: {SKILL}\ndescription: {edition(k)}\n---\nRead the tide tables.\n"
        self.skill_md.write_text(text, encoding="utf-8")
        self.editions.append(time.time())

    def in_force(self, when: float) -> int:
        """The edition on disk at ``when``."""
        return max(k for k, at in enumerate(self.editions) if at <= when)

    def register(self) -> None:
        base = self.provider.base_url
        hashes = []
        for toml in (
            agent_toml(base, "pilot", ["lookup_invoice"]),
            agent_toml(base, "delegator", [], ["subagent"]),
        ):
            response = self.http.post(
                "/v1/agents",
                content=f'skills = ["{SKILL}"]\n{toml}',
                headers={"content-type": "application/toml"},
            )
            assert response.status_code == 201, response.text
            hashes.append(response.json()["agent"])
        self.pilot, self.agent = hashes
        response = self.http.post("/v1/graphs", json=skills_graph(self.pilot))
        assert response.status_code == 201, response.text
        self.graph = response.json()["graph"]

    def draw_root(self, case: str) -> Root:
        at = {"skill": self.location}
        if self.rng.random() < 0.5:
            items = [{"tag": f"{case}-{i}", **at} for i in range(self.rng.randint(2, 3))]
            run_input = {"items": items, "extra": {"tag": f"{case}-x", **at}}
            return Root(case, "graph", run_input)
        tags = " ".join(f"{case}-{i}" for i in range(self.rng.randint(1, 3)))
        run_input = {"task": "delegate", "inputs": {"tag": case, "tags": tags, **at}}
        return Root(case, "tree", run_input, run_id=str(uuid.uuid4()))

    def fault(self, point: str) -> tuple[str, str]:
        """``RESOLVED``: right after the first commit of a seq 2, in a pilot's or a delegator's
        log the completion of its ``resolve_skills`` (a run's head, its read asked, answered)."""
        self.points_drawn[point] += 1
        if point == RESOLVED:
            return AFTER_SEQ_VAR, "2"
        return super().fault(point)

    def stop(self, kind: str, rng) -> None:
        """The harness's stop, then the skill's next edition (no daemon runs)."""
        super().stop(kind, rng)
        self.write_edition()

    def check_world(self) -> dict[str, list[ProviderCall]]:
        """The model requests the provider saw, by the tag of the run that sent them."""
        by_tag = defaultdict(list)
        for call in list(self.provider.calls):
            by_tag[work_of(call)["tag"]].append(call)
        return by_tag

    def check_log(self, where: str, member: Member, view: Any, by_tag, *, final: bool) -> None:
        """A run whose agent declares the skill resolved it once, recorded the edition on disk,
        and every request it sent advertised that one."""
        log = member.log
        head = log[0].event
        run_input = head.input["extra"] if head.KIND is EventKind.GRAPH_RUN_STARTED else head.input
        tag = run_input.get("inputs", run_input)["tag"]
        resolves = [e for e in log if getattr(e.event, "tool", None) == RESOLVE]
        models = [e for e in log if e.event.KIND is EventKind.MODEL_CALL_REQUESTED]
        if len(resolves) > 1:
            self.violation(f"{where}: its skills resolved {len(resolves)} times")
        if models and (not resolves or resolves[0].seq > models[0].seq):
            self.violation(f"{where}: a model call before its skills were resolved")
        completed = {e.event.seq: e for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED}
        done = completed.get(resolves[0].seq) if resolves else None
        if done is None:
            # Not resolved yet: no request of it may have been sent (it would name no skill).
            if by_tag.get(tag):
                self.violation(f"{where}: requests sent before its skills were recorded")
            return
        output = done.event.output
        skills = output.get("skills") if isinstance(output, dict) else None
        if not isinstance(skills, list) or len(skills) != 1:
            self.violation(f"{where}: its skills were recorded as {output!r}")
            return
        recorded = skills[0]["description"]
        expected = edition(self.in_force(recorded_at(done)))
        if recorded != expected:
            self.violation(f"{where}: recorded {recorded!r}, the disk then held {expected!r}")
        editions = set()
        for call in by_tag.get(tag, []):
            shown = advertised(call)
            if shown != [recorded]:
                self.violation(
                    f"{where}: request {call.index} advertised {shown}, not {recorded!r}"
                )
            editions.add(self.served_in.get(call.index))
        if final:
            self.skilled_runs += 1
            self.kept_across += len(editions) > 1
            self.later_edition += recorded != edition(0)

    def _on_call(self, call: ProviderCall) -> None:
        # A stop's change comes after the daemon died: a request is served under the edition
        # its daemon read.
        self.served_in[call.index] = len(self.editions) - 1
        super()._on_call(call)

    def figures(self, began: float) -> dict:
        figures = super().figures(began)
        figures["editions"] = len(self.editions)
        figures["in_write_points_drawn"] = dict(self.points_drawn)
        figures["skilled_runs"] = self.skilled_runs
        figures["runs_kept_an_edition_across_a_change"] = self.kept_across
        figures["runs_recorded_a_later_edition"] = self.later_edition
        return figures


def schedule(store_url: str) -> tuple[list[str], int, float]:
    """The composed tests' short schedule, its SIGKILLs and a bound on their time; with
    ``SALVOR_CHAOS_KILLS`` set, that many SIGKILLs (stops drawn at random once the schedule runs
    out), with time for them."""
    kinds, kills = kill_schedule(store_url.startswith("sqlite"), SEED)
    kills = int(os.environ.get("SALVOR_CHAOS_KILLS", kills))
    return kinds, kills, max(600.0, 10.0 * kills)


def test_skills_of_composed_runs_killed_at_random_instants_keep_the_prompt_each_recorded(
    tmp_path: Path, store_url: str
) -> None:
    began = time.monotonic()
    kinds, kills, seconds = schedule(store_url)
    harness = ComposedSkills(tmp_path, store_url, SEED)
    try:
        run_composed(harness, kinds, kills=kills, seconds=seconds)
    finally:
        harness.close()
    figures = harness.figures(began)
    print("composed skills chaos:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert figures["roots_unfinished_at_the_end"] == 0, figures
    assert figures["runs_kept_an_edition_across_a_change"] > 0, figures
    assert figures["runs_recorded_a_later_edition"] > 0, figures
    assert all(figures["kills_by_kind"].get(kind) for kind in ("random", "double", "in_write"))
