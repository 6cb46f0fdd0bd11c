"""Where the agent catalog says each agent came from: an agent read from a file is ``local``
with the file's path (a flow's agent file, an agent file a local command ran), one registered
over the API or written by a run is ``store``; every entry has ``architect``.

Real files in a temporary project, the `salvor` command in this process, the catalog read from
the store it wrote.
"""

from __future__ import annotations

import os
from pathlib import Path

from salvor.daemon.agents import parse_definition
from salvor.daemon.runs._flow_catalog import _catalog
from salvor.store import EventStore

from tests.daemon.cli.test_flow_files import _env, _flow, _project
from tests.support.cli import salvor_in_process

ARCHITECT = """---
name: planner
description: Plans.
model: m
architect:
  use_when: a task needs steps
llm:
  provider: demo
---
Plan.
"""


def test_a_flows_agent_file_is_local_with_its_path_and_an_api_agent_is_store(
    tmp_path: Path, store_url: str
) -> None:
    project = _project(tmp_path)
    started = salvor_in_process(
        "graph", "run", str(_flow(project)), "--input", '{"topic": "bees"}', env=_env(store_url)
    )
    assert started.returncode == 0, started.stderr
    planner = parse_definition(ARCHITECT, "md")
    with EventStore.open(store_url) as store:
        # What POST /v1/agents does: no file.
        store.definitions.put_agent(
            planner.agent_def_hash, format="md", definition=ARCHITECT, name="planner"
        )
        catalog = _catalog(store, [])
    by_name = {entry["name"]: entry for entry in catalog}
    real = os.path.realpath(project)
    researcher = by_name["researcher"]
    assert researcher["source_type"] == "local"
    assert researcher["source_path"] == f"{real}/agents/research/researcher.toml"
    assert researcher["architect"] == {}
    api = by_name["planner"]
    assert api["source_type"] == "store" and "source_path" not in api
    assert api["architect"] == {"use_when": "a task needs steps"}


def test_an_agent_file_a_local_command_ran_is_local_with_its_absolute_path(
    tmp_path: Path, store_url: str
) -> None:
    agent = tmp_path / "planner.md"
    agent.write_text(ARCHITECT)
    ran = salvor_in_process("run", str(agent), "--input", '"plan a picnic"', env=_env(store_url))
    assert ran.returncode == 0, ran.stderr
    with EventStore.open(store_url) as store:
        (entry,) = _catalog(store, [])
    assert (entry["source_type"], entry["source_path"]) == ("local", str(agent.resolve()))
