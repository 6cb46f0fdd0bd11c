"""A local ``salvor run`` finds skills in the folders ``SALVOR_SKILLS_DIRS`` names, before
salvor's own, as ``salvor serve --skills-dir`` does: a name it does not hold is refused with the
nearest one it does, and a run of an agent declaring a skill it holds records where that skill
is. The `salvor` command in this process, over a real SQLite store.
"""

from __future__ import annotations

import os
from pathlib import Path

from salvor.protocol import EventKind
from salvor.store import EventStore

from tests.daemon.cli.test_flow_files import _env
from tests.daemon.skills.skill_folders import workspace_with_skills
from tests.support.cli import salvor_in_process

AGENT = 'name = "pilot"\nmodel = "demo-planner"\nskills = ["{skill}"]\n[llm]\nprovider = "demo"\n'


def test_a_local_run_finds_skills_in_salvor_skills_dirs(tmp_path: Path, store_url: str) -> None:
    _, skills, _ = workspace_with_skills(tmp_path)
    agent = tmp_path / "pilot.toml"
    env = {**_env(store_url), "SALVOR_SKILLS_DIRS": f"/nonexistent{os.pathsep}{skills}"}
    agent.write_text(AGENT.format(skill="tide-tabels"))
    refused = salvor_in_process("run", str(agent), "--input", '"sail?"', env=env)
    assert refused.returncode != 0
    assert "unknown skill 'tide-tabels' (did you mean `tide-tables`?)" in refused.stderr
    agent.write_text(AGENT.format(skill="tide-tables"))
    ran = salvor_in_process("run", str(agent), "--input", '"sail?"', env=env)
    assert ran.returncode == 0, ran.stderr
    run_id = ran.stdout.split()[0]
    with EventStore.open(store_url) as store:
        log = store.read_log(run_id)
    (resolved,) = [
        e for e in log if e.kind == EventKind.TOOL_CALL_COMPLETED and "skills" in e.event.output
    ]
    (skill,) = resolved.event.output["skills"]
    assert skill["location"] == os.path.realpath(skills / "tide-tables" / "SKILL.md")
    # Without the variable only salvor's own skills are found.
    unset = salvor_in_process("run", str(agent), "--input", '"sail?"', env=_env(store_url))
    assert unset.returncode != 0 and "unknown skill 'tide-tables'" in unset.stderr
