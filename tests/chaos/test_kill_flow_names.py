"""``flow_write`` across a SIGKILL: a real `salvor run` killed inside the call, after the flow was
named and before the call's completion was recorded; the next `salvor resume` performs the call
again (it is idempotent) and the name still has one version, the one the killed process wrote.
On both backends: the version is the store's to keep, and naming the same graph again makes none.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest
from salvor.protocol import EventKind
from salvor.store import EventStore

from tests.chaos.test_kill_probes import salvor  # noqa: F401 (the fixture)
from tests.chaos.test_kill_serve import assert_log_valid
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script

pytestmark = pytest.mark.kill

FLOW = "schema_version: 1\nnodes:\n  - id: ok\n    kind: gate\n    prompt: Go?\nedges: []\n"


def _calls(log, kind: EventKind) -> list:
    return [e.event for e in log if e.event.KIND is kind]


def test_a_flow_write_killed_after_naming_leaves_one_version(
    tmp_path: Path,
    store_url: str,
    salvor,  # noqa: F811
) -> None:
    write = {"namespace": "team", "name": "triage", "content": FLOW}
    provider = ScriptedProvider(tool_loop_script([("flow_write", write)], final_text="written"))
    try:
        agent = tmp_path / "author.toml"
        agent.write_text(
            'model = "scripted"\nflow_tools = ["flow_write"]\n[llm]\nprovider = "anthropic"\n'
            f'base_url = "{provider.base_url}"\nmax_retries = 0\n',
            encoding="utf-8",
        )
        EventStore.open(store_url).close()  # edit-mode sets a store that exists
        assert salvor("edit-mode", "on").returncode == 0
        run_id = str(uuid.uuid4())
        killed = salvor(
            "run", str(agent), "--run-id", run_id, SALVOR_FAULT_KILL_IN_TOOL="flow_write"
        )
        assert killed.returncode == -signal.SIGKILL, killed
        with EventStore.open(store_url) as store:
            named = store.named_flows.versions("team", "triage")
            log = store.read_log(run_id)
        assert [(v.version, v.run_id) for v in named] == [(1, run_id)]
        assert _calls(log, EventKind.TOOL_CALL_COMPLETED) == []  # the call is still open

        done = salvor("resume", run_id)
        assert done.returncode == 0 and "completed" in done.stdout, done
        with EventStore.open(store_url) as store:
            assert store.named_flows.versions("team", "triage") == named
            log = store.read_log(run_id)
        assert_log_valid(log)
        (intent,) = _calls(log, EventKind.TOOL_CALL_REQUESTED)
        (completion,) = _calls(log, EventKind.TOOL_CALL_COMPLETED)
        assert intent.tool == "flow_write"
        output = completion.output
        assert (output["version"], output["new_version"]) == (1, False)
        assert output["graph"] == named[0].graph_hash
        # The model call before the kill was answered from the log, never asked again.
        assert provider.call_count == 2
    finally:
        provider.stop()
