"""Re-runs: a completed agent-process run reproduced from its log with zero upstream calls.

The origin is recorded for real (a real SDK agent, the scripted provider
upstream). A re-run starts the agent again with the origin's task; every
model call must hash-equal the origin's call at its position and is answered
from the origin's log, so the provider's call count never moves. An agent
whose code changed fails the re-run at the first call that differs, naming
it; one that stops early or asks for more fails too.
"""

from __future__ import annotations

import pytest
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.proxies._model_proxy import REPRODUCED_PER_COMMIT
from salvor.daemon.recording._run_context import DriveInterrupted
from salvor.daemon.web._errors import OperationRefused
from salvor.protocol import EventKind

from tests.daemon.agents.test_process_agent import BACKEND_MODES, PLAN, SECRET, process_agent
from tests.daemon.cli.test_cli import salvor_process as salvor
from tests.support.backends import SQLITE_ONLY
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is re-runs answered from an origin's log
# (BACKEND_MODES keeps PostgreSQL for the trajectory test).
STORE_BACKENDS = SQLITE_ONLY


async def record_origin(runtime, provider, upstream_env, tmp_path, mode: str = "openai", **kwargs):
    upstream_env(provider)
    agent = process_agent(tmp_path, mode, **kwargs)
    run_id = await runtime.starts.start_run(agent, "settle invoice A-1")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    return agent, run_id


async def model_calls(runtime, run_id: str) -> list[tuple[str, dict]]:
    """(request_hash, response) of each completed model call, in order."""
    log = await runtime.reads.log(run_id)
    hashes = {
        e.seq: e.event.request_hash for e in log if e.event.KIND is EventKind.MODEL_CALL_REQUESTED
    }
    return [
        (hashes[e.event.seq], e.event.response)
        for e in log
        if e.event.KIND is EventKind.MODEL_CALL_COMPLETED
    ]


async def store_run_count(runtime) -> int:
    page, _ = await runtime.access.read(lambda: runtime.access.store.list_runs())
    return len(page)


@pytest.mark.parametrize(("store_url", "mode"), BACKEND_MODES, indirect=["store_url"])
async def test_a_rerun_reproduces_the_trajectory_with_zero_upstream_calls(
    runtime, providers, upstream_env, tmp_path, mode
):
    provider = providers(tool_loop_script(PLAN, final_text="refund settled"))
    agent, origin = await record_origin(runtime, provider, upstream_env, tmp_path, mode)
    served = provider.call_count
    assert served == 3
    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "refund settled", "exit_code": 0}
    assert view.replay_of == origin and view.input == "settle invoice A-1"
    assert provider.call_count == served  # not one call upstream
    assert await model_calls(runtime, rerun) == await model_calls(runtime, origin)
    # The recorded usage is the origin's too: a re-run reports what the trajectory cost.
    origin_view = await runtime.reads.view(origin)
    assert (view.input_tokens, view.output_tokens) == (
        origin_view.input_tokens,
        origin_view.output_tokens,
    )


async def test_a_rerun_works_with_no_upstream_configured_at_all(
    runtime, providers, upstream_env, tmp_path, monkeypatch
):
    provider = providers(tool_loop_script(PLAN))
    agent, origin = await record_origin(
        runtime, provider, upstream_env, tmp_path, "anthropic-stream"
    )
    monkeypatch.delenv("SALVOR_AGENT_UPSTREAM")
    monkeypatch.delenv("SALVOR_AGENT_KEY")
    provider.stop()
    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail


async def test_changed_agent_code_fails_the_rerun_at_the_first_divergent_call_naming_it(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(tool_loop_script(PLAN))
    _, origin = await record_origin(
        runtime, provider, upstream_env, tmp_path, "openai", extra="record_prompts = true"
    )
    # New code: the tool result the agent threads back changed, so call 2's body differs.
    changed = process_agent(tmp_path, "openai", env={"AMOUNT": "43"}, extra="record_prompts = true")
    rerun = await runtime.starts.start_run(changed, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=changed)
    assert view.state.value == "failed"
    error = view.detail["error"]
    assert error.startswith(f"model call 2 (recorded by origin run {origin} at seq "), error
    assert (
        "same model, tool names and message roles; the body differs at body.messages[2].content"
        in error
    )
    assert provider.call_count == 3
    # The first call was reproduced and kept; nothing after the divergence was recorded.
    assert len(await model_calls(runtime, rerun)) == 1


async def test_a_rerun_without_recorded_prompts_names_the_envelope_difference(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(tool_loop_script(PLAN))
    _, origin = await record_origin(runtime, provider, upstream_env, tmp_path, "anthropic")
    model_file = tmp_path / "model.txt"
    model_file.write_text("claude-next")
    changed = process_agent(tmp_path, "anthropic", env={"MODELFILE": str(model_file)})
    rerun = await runtime.starts.start_run(changed, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=changed)
    assert view.state.value == "failed"
    error = view.detail["error"]
    assert "model call 1" in error and f"origin run {origin}" in error
    assert "'claude-next' where the recorded call was answered by 'scripted-model'" in error
    assert provider.call_count == 3


async def test_an_agent_that_stops_early_or_asks_for_more_fails_the_rerun(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(tool_loop_script(PLAN))
    agent, origin = await record_origin(runtime, provider, upstream_env, tmp_path, "openai")
    exit_file = tmp_path / "exit.txt"
    exit_file.write_text("1")
    early = process_agent(tmp_path, "openai", env={"EXITFILE": str(exit_file)})
    view = await runtime.drive(
        await runtime.starts.start_run(early, None, replay_of=origin), agent=early
    )
    assert view.state.value == "failed"
    assert f"after 1 of the 3 model calls origin run {origin} recorded" in view.detail["error"]

    # An origin that stopped after its first call (a tool call, kept as its answer) ...
    _, short = await record_origin(
        runtime, provider, upstream_env, tmp_path / "..", "openai", env={"EXITFILE": str(exit_file)}
    )
    assert (await runtime.reads.view(short)).detail["output"] == {
        "tool_calls": [{"name": "lookup_invoice", "arguments": {"invoice": "A-1"}}],
        "exit_code": 0,
    }
    # ... re-run by code that keeps going: its second call has no counterpart.
    view = await runtime.drive(
        await runtime.starts.start_run(agent, None, replay_of=short), agent=agent
    )
    assert view.state.value == "failed"
    assert (
        f"model call 2 has no counterpart: origin run {short} recorded only 1 model calls"
        in view.detail["error"]
    )
    assert provider.call_count == 4  # the two origins; the re-runs made none


@pytest.mark.parametrize("per_commit", [1, REPRODUCED_PER_COMMIT])
async def test_a_rerun_killed_mid_way_recovers_from_its_own_log_then_the_origin(
    runtime, providers, upstream_env, tmp_path, monkeypatch, per_commit
):
    # Reproduced calls are committed in batches; with batches of one, the
    # second drive answers the first two calls from the re-run's own log.
    monkeypatch.setattr("salvor.daemon.proxies._model_proxy.REPRODUCED_PER_COMMIT", per_commit)
    provider = providers(tool_loop_script(PLAN))
    _, origin = await record_origin(runtime, provider, upstream_env, tmp_path, "anthropic-stream")
    dying = process_agent(
        tmp_path, "anthropic-stream", env={"DIE_AFTER": "2", "MARKER": str(tmp_path / "died")}
    )
    rerun = await runtime.starts.start_run(dying, None, replay_of=origin)
    with pytest.raises(DriveInterrupted, match="killed by signal 9"):
        await runtime.drive(rerun, agent=dying)
    kept = await model_calls(runtime, rerun)
    assert kept == (await model_calls(runtime, origin))[: len(kept)]
    if per_commit == 1:
        assert len(kept) == 2
    view = await runtime.drive(rerun, agent=dying)
    assert view.state.value == "completed", view.detail
    assert await model_calls(runtime, rerun) == await model_calls(runtime, origin)
    kinds = [e.kind for e in await runtime.reads.log(rerun)]
    assert kinds.count("ModelCallRequested") == 3 and kinds.count("ModelCallCompleted") == 3
    assert provider.call_count == 3


async def test_rerun_refusals_record_nothing(runtime, providers, upstream_env, tmp_path):
    provider = providers(tool_loop_script(PLAN))
    agent, origin = await record_origin(runtime, provider, upstream_env, tmp_path, "openai")
    broken = process_agent(tmp_path, script="import sys\nsys.exit(4)\n")
    failed = await runtime.starts.start_run(broken, "x")
    assert (await runtime.drive(failed, agent=broken)).state.value == "failed"
    builtin = parse_definition('model = "m"\n[llm]\nprovider = "demo"\n', "toml")
    before = await store_run_count(runtime)
    cases = [
        (agent, "0b5c1a52-6a7e-4d0e-9a52-3f7c2a9e0d11", "unknown_run", 404),
        (agent, failed, "wrong_state", 409),
        (agent, "not-a-run", "bad_request", 400),
        (builtin, origin, "bad_request", 400),
    ]
    for definition, replay_of, code, status in cases:
        with pytest.raises(OperationRefused) as caught:
            await runtime.starts.start_run(definition, None, replay_of=replay_of)
        assert (caught.value.code, caught.value.status) == (code, status), caught.value.message
        if code == "wrong_state":
            assert "only a completed run has a whole trajectory" in caught.value.message
            assert caught.value.details == {"replay_of": failed, "state": "failed"}
    assert await store_run_count(runtime) == before


def test_salvor_rerun_passes_then_fails_a_changed_agent(store_url, providers, tmp_path):
    provider = providers(tool_loop_script(PLAN, final_text="settled"))
    agent = process_agent(tmp_path, "openai", extra="record_prompts = true")
    (tmp_path / "agent.toml").write_text(agent.stored_text)
    env = {"SALVOR_AGENT_UPSTREAM": provider.base_url, "SALVOR_AGENT_KEY": SECRET}
    result = salvor(
        store_url, "run", str(tmp_path / "agent.toml"), "--json", "--input", '"settle A-1"', env=env
    )
    assert result.returncode == 0, result.stderr
    origin = result.stdout.splitlines()[0].split('"')[3]
    result = salvor(store_url, "rerun", origin)
    assert result.returncode == 0, result.stderr
    assert 'completed: {"reply": "settled", "exit_code": 0}' in result.stdout
    changed = process_agent(tmp_path, "openai", env={"AMOUNT": "43"}, extra="record_prompts = true")
    (tmp_path / "changed.toml").write_text(changed.stored_text)
    result = salvor(store_url, "rerun", origin, "--agent", str(tmp_path / "changed.toml"))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "failed: model call 2" in result.stdout
    result = salvor(store_url, "rerun", "not-a-run")
    assert result.returncode == 2 and "is not a run id" in result.stderr  # a usage error
    assert provider.call_count == 3
