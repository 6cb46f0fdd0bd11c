"""Cross-run claims of a process agent's MCP calls through the stand-ins, over a real store.

The agents are real subprocesses on the ``mcp`` SDK (``mcp_standin_agents``),
their model the scripted provider; the server is the fixture MCP server,
whose ledger counts what it performed and records the ``_meta`` each call
carried. ``write_note`` is keyed on its ``text``: two runs asking for the
same note are one identity, which the store lets one call perform.
"""

from __future__ import annotations

import pytest
import trio
from salvor.daemon.proxies import _mcp_record as record_module
from salvor.daemon.proxies._mcp_lane import call_failed
from salvor.daemon.recording import CallInFlight, open_store_access, tool_error
from salvor.daemon.recording._run_context import DriveInterrupted
from salvor.daemon.runs._runtime import Runtime
from salvor.daemon.tools import derived_key
from salvor.protocol import EventKind, RunState, sha256_hash

from tests.support.backends import BOTH, SQLITE_ONLY
from tests.support.mcp_standin_agents import standin_agent
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py), but for the race: two runs claiming one identity
# at once is the store's behaviour, so that test keeps both backends.
STORE_BACKENDS = SQLITE_ONLY

NOTE = "refund INV-7"
IDENTITY = sha256_hash({"tool": "write_note", "mcp_server": "fix", "text": NOTE})
KEYED = 'idempotency_keys = { write_note = "text", fail_soft = "id" }\n'


def keyed_agent(tmp_path, fx, *, effect="write", keys=KEYED, env=None, server_args=()):
    return standin_agent(
        tmp_path,
        f"command = {fx.toml_command(*server_args)}\n",
        effects=f'effects = {{ write_note = "{effect}", fail_soft = "write" }}\n',
        server_extra=keys,
        env=env,
    )


def calls_of(log, tool: str) -> list[tuple[int, object, object]]:
    """The run's ``tools/call`` of ``tool``: (seq, intent, completion or None)."""
    done = {e.event.seq: e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED}
    return [
        (e.seq, e.event, done.get(e.seq))
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED
        and e.event.tool == "mcp:fix/tools/call"
        and e.event.input["name"] == tool
    ]


def told(provider) -> list[str]:
    """The tool results the agent handed its model, in order."""
    return [
        m["content"]
        for call in provider.calls
        for m in call.body.get("messages", [])
        if m.get("role") == "tool"
    ]


async def drive_one(runtime, providers, tmp_path, fx, plan, **kwargs):
    provider = providers(tool_loop_script(plan, final_text="noted"))
    agent = keyed_agent(tmp_path, fx, **kwargs)
    run_id = await runtime.starts.start_run(agent, "note it")
    return run_id, agent, provider


async def test_two_process_runs_asking_for_one_keyed_write_perform_it_once(
    runtime, providers, upstream_env, tmp_path, fx
):
    runs = []
    for _ in range(2):
        run_id, agent, provider = await drive_one(
            runtime, providers, tmp_path, fx, [("write_note", {"text": NOTE})]
        )
        upstream_env(provider)
        view = await runtime.drive(run_id, agent=agent)
        assert view.state is RunState.COMPLETED, view.detail
        runs.append((run_id, provider))
    (first, _), (second, second_provider) = runs

    # The server performed the note once, and saw the identity as its key.
    [performed] = fx.calls_of("write_note")
    assert performed["meta"] == {"salvor": {"idempotency_key": IDENTITY, "run_id": first}}
    [(seq_a, intent_a, done_a)] = calls_of(await runtime.reads.log(first), "write_note")
    [(_, intent_b, done_b)] = calls_of(await runtime.reads.log(second), "write_note")
    assert intent_a.idempotency_key == intent_b.idempotency_key == IDENTITY
    assert done_a.deduplicated_from is None
    # The second run recorded the first's result, naming where it came from; its agent was
    # answered with that result as if the server had sent it.
    assert done_b.output == {"result": done_a.output["result"]}
    assert done_b.deduplicated_from == {"run_id": first, "seq": seq_a}
    assert told(second_provider) == [f"noted {NOTE}"]
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert (claim.run_id, claim.seq, claim.state) == (first, seq_a, "settled")

    # A re-run of the second run answers from its log and starts no server (each run started
    # one for its live initialize and listing).
    assert len(fx.starts) == 2
    agent = keyed_agent(tmp_path, fx)
    rerun = await runtime.starts.start_run(agent, None, replay_of=second)
    assert (await runtime.drive(rerun, agent=agent)).state is RunState.COMPLETED
    assert len(fx.calls_of("write_note")) == 1 and len(fx.starts) == 2


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
async def test_two_process_runs_racing_on_one_key_over_one_store_perform_it_once(
    store_url, registry, providers, upstream_env, tmp_path, fx, monkeypatch
):
    # The first run's note is held on the server until the second has met its open claim.
    # Both agents ask one scripted model (the daemon has one upstream), so both ask for the
    # held note; only the first call's hold ever reaches the server.
    held = {"text": NOTE, "hold": fx.hold("w")}
    provider = providers(tool_loop_script([("write_note", held)], final_text="noted"))
    upstream_env(provider)
    agent = keyed_agent(tmp_path, fx)
    async with (
        open_store_access(store_url) as access_a,
        open_store_access(store_url) as access_b,
    ):
        first, second = Runtime(access_a, registry), Runtime(access_b, registry)
        run_a = await first.starts.start_run(agent, "note it")
        run_b = await second.starts.start_run(agent, "note it")
        saw_open = trio.Event()
        token = trio.lowlevel.current_trio_token()
        original = access_b.store.claims.get_claim

        def get_claim(identity):
            claim = original(identity)
            if claim is not None and claim.state == "open":
                token.run_sync_soon(saw_open.set)
            return claim

        monkeypatch.setattr(access_b.store.claims, "get_claim", get_claim)
        views = {}

        async def drive(runtime, run_id):
            views[run_id] = await runtime.drive(run_id, agent=agent)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drive, first, run_a)
                while not fx.calls_of("write_note"):
                    await trio.sleep(0.02)
                nursery.start_soon(drive, second, run_b)
                await saw_open.wait()
                fx.release("w")

        assert views[run_a].state is RunState.COMPLETED, views[run_a].detail
        assert views[run_b].state is RunState.COMPLETED, views[run_b].detail
        assert [c["meta"]["salvor"]["run_id"] for c in fx.calls_of("write_note")] == [run_a]
        [(seq_a, _, done_a)] = calls_of(await first.reads.log(run_a), "write_note")
        [(_, _, done_b)] = calls_of(await second.reads.log(run_b), "write_note")
        assert done_a.deduplicated_from is None
        assert done_b.deduplicated_from == {"run_id": run_a, "seq": seq_a}
        assert done_b.output == {"result": done_a.output["result"]}


async def test_a_failing_keyed_call_releases_its_identity_and_the_next_run_performs_it(
    runtime, providers, upstream_env, tmp_path, fx
):
    identity = sha256_hash({"tool": "fail_soft", "mcp_server": "fix", "id": "x"})
    outcomes = []
    for _ in range(2):
        run_id, agent, provider = await drive_one(
            runtime, providers, tmp_path, fx, [("fail_soft", {"id": "x"})]
        )
        upstream_env(provider)
        assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
        [(_, intent, done)] = calls_of(await runtime.reads.log(run_id), "fail_soft")
        assert intent.idempotency_key == identity
        outcomes.append(done)
    # An isError result left nothing to copy: the second run performed the call itself.
    assert len(fx.calls_of("fail_soft")) == 2
    assert all(done.deduplicated_from is None for done in outcomes)
    assert outcomes[1].output["result"]["isError"] is True
    assert await runtime.access.read(runtime.access.store.claims.get_claim, identity) is None


@pytest.mark.parametrize(
    ("output", "failed"),
    [
        ({"result": {"content": [], "isError": True}}, True),
        ({"error": {"code": -32602, "message": "unknown tool"}}, True),
        (tool_error("handler", "the server went away", 3), True),
        ({"result": {"content": [], "isError": False}}, False),
        ({"result": {"content": []}, "notifications": []}, False),
    ],
)
def test_what_counts_as_a_failed_call(output, failed):
    assert call_failed(output) is failed


async def test_a_keyed_call_whose_identity_stays_held_stops_the_drive_writing_nothing(
    runtime, providers, upstream_env, tmp_path, fx, monkeypatch
):
    # The first run's write reached the server and its drive died there: its claim stays open.
    held = {"text": NOTE, "hold": fx.hold("w")}
    run_a, agent_a, provider_a = await drive_one(
        runtime, providers, tmp_path, fx, [("write_note", held)]
    )
    upstream_env(provider_a)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime.drive, run_a)
            while not fx.calls_of("write_note"):
                await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
    fx.release("w")

    monkeypatch.setenv("SALVOR_CLAIM_WAIT_SECONDS", "0.2")
    run_b, agent_b, provider_b = await drive_one(
        runtime, providers, tmp_path, fx, [("write_note", {"text": NOTE})]
    )
    upstream_env(provider_b)
    with pytest.raises(CallInFlight) as stopped:
        await runtime.drive(run_b, agent=agent_b)
    assert stopped.value.claim.run_id == run_a
    # Nothing of the second call was written; its agent's model call before it stays recorded.
    log_b = await runtime.reads.log(run_b)
    assert calls_of(log_b, "write_note") == []
    assert log_b[-1].event.KIND is EventKind.MODEL_CALL_COMPLETED
    assert (await runtime.reads.view(run_b)).state is RunState.RUNNING
    assert len(fx.calls_of("write_note")) == 1

    # The first run's open write parks it; a person records what it did, which settles the claim.
    assert (await runtime.drive(run_a, agent=agent_a)).state is RunState.NEEDS_RECONCILIATION
    resolved = {"result": {"content": [{"type": "text", "text": f"noted {NOTE}"}]}}
    await runtime.control.resolve(run_a, resolved, {})
    # The second run, driven again, asks again and copies that outcome.
    view = await runtime.drive(run_b, agent=agent_b)
    assert view.state is RunState.COMPLETED, view.detail
    [(_, _, done_b)] = calls_of(await runtime.reads.log(run_b), "write_note")
    [(seq_a, _, _)] = calls_of(await runtime.reads.log(run_a), "write_note")
    assert done_b.output == resolved and done_b.deduplicated_from == {"run_id": run_a, "seq": seq_a}
    assert len(fx.calls_of("write_note")) == 1


async def test_an_open_keyed_idempotent_call_runs_again_under_its_identity_and_settles_it(
    runtime, providers, upstream_env, tmp_path, fx
):
    note = {"text": NOTE, "hold": fx.hold("w")}
    env = {"DIE_IN": "write_note", "DIE_DELAY": "1.0", "MARKER": str(tmp_path / "died")}
    run_id, agent, provider = await drive_one(
        runtime, providers, tmp_path, fx, [("write_note", note)], effect="idempotent", env=env
    )
    upstream_env(provider)
    with pytest.raises(DriveInterrupted, match="killed by signal 9"):
        await runtime.drive(run_id, agent=agent)
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert (claim.run_id, claim.state) == (run_id, "open")
    fx.release("w")

    assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
    # The retry of the same call carried the same key, where the server sees it.
    first, again = fx.calls_of("write_note")
    assert (
        first["meta"]
        == again["meta"]
        == {"salvor": {"idempotency_key": IDENTITY, "run_id": run_id}}
    )
    [(seq, _, done)] = calls_of(await runtime.reads.log(run_id), "write_note")
    claim = await runtime.access.read(runtime.access.store.claims.get_claim, IDENTITY)
    assert (claim.run_id, claim.seq, claim.state) == (run_id, seq, "settled")
    assert claim.output == done.output


async def test_an_idempotent_call_without_key_fields_presents_its_positions_key(
    runtime, providers, upstream_env, tmp_path, fx
):
    run_id, agent, provider = await drive_one(
        runtime,
        providers,
        tmp_path,
        fx,
        [("write_note", {"text": NOTE})],
        effect="idempotent",
        keys="",
    )
    upstream_env(provider)
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
    [(seq, intent, _)] = calls_of(await runtime.reads.log(run_id), "write_note")
    derived = derived_key(run_id, seq, "mcp:fix/tools/call")
    assert intent.idempotency_key == derived
    [performed] = fx.calls_of("write_note")
    assert performed["meta"]["salvor"]["idempotency_key"] == derived
    assert await runtime.access.read(runtime.access.store.claims.get_claim, derived) is None


async def test_a_keyed_call_missing_its_key_field_is_recorded_as_its_failure(
    runtime, providers, upstream_env, tmp_path, fx
):
    run_id, agent, provider = await drive_one(
        runtime, providers, tmp_path, fx, [("write_note", {"body": NOTE})]
    )
    upstream_env(provider)
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
    [(_, intent, done)] = calls_of(await runtime.reads.log(run_id), "write_note")
    assert intent.idempotency_key is None and "`text`" in str(done.output)
    assert fx.calls_of("write_note") == []


async def test_an_open_idempotent_call_an_older_build_keyed_at_random_runs_again_under_that_key(
    runtime, providers, upstream_env, tmp_path, fx, monkeypatch
):
    # Before derived keys the lane drew a random `idem_...` key; its log still recovers, and the
    # re-execution presents the key the intent recorded, not one derived now.
    old_key = "idem_" + "ab" * 16
    monkeypatch.setattr(record_module, "derived_key", lambda *_: old_key)
    note = {"text": NOTE, "hold": fx.hold("w")}
    env = {"DIE_IN": "write_note", "DIE_DELAY": "1.0", "MARKER": str(tmp_path / "died")}
    run_id, agent, provider = await drive_one(
        runtime,
        providers,
        tmp_path,
        fx,
        [("write_note", note)],
        effect="idempotent",
        keys="",
        env=env,
    )
    upstream_env(provider)
    with pytest.raises(DriveInterrupted, match="killed by signal 9"):
        await runtime.drive(run_id, agent=agent)
    monkeypatch.undo()
    upstream_env(provider)
    fx.release("w")

    assert (await runtime.drive(run_id, agent=agent)).state is RunState.COMPLETED
    assert [c["meta"]["salvor"]["idempotency_key"] for c in fx.calls_of("write_note")] == [
        old_key,
        old_key,
    ]


async def test_a_keyed_call_whose_result_puts_its_run_to_sleep_settles_its_claim_in_that_write(
    runtime, providers, upstream_env, tmp_path, fx, monkeypatch
):
    wake_at = "2026-11-29T10:00:00Z"  # an hour after the test clock's start
    park = ("park", {"salvor": {"sleep_until": wake_at}})
    identity = sha256_hash({"tool": "park", "mcp_server": "fix", "salvor.sleep_until": wake_at})
    access = runtime.access
    appends = []
    append = access.append

    async def observed(run_id, events, view, **claims):
        appends.append(([event.KIND for event in events], claims))
        return await append(run_id, events, view, **claims)

    monkeypatch.setattr(access, "append", observed)
    # A claim left open would stop the next caller within this bound, not let it copy.
    monkeypatch.setenv("SALVOR_CLAIM_WAIT_SECONDS", "0.05")
    runs = []
    for _ in range(2):
        provider = providers(tool_loop_script([park], final_text="woke"))
        upstream_env(provider)
        agent = standin_agent(
            tmp_path,
            f"command = {fx.toml_command()}\n",
            effects='effects = { park = "write" }\n',
            server_extra='idempotency_keys = { park = "salvor.sleep_until" }\n',
        )
        run_id = await runtime.starts.start_run(agent, "wait an hour")
        runs.append((run_id, (await runtime.drive(run_id, agent=agent)).state))
        if len(runs) == 1:
            (asleep,) = [(k, c) for k, c in appends if EventKind.SLEEP_STARTED in k]
            assert EventKind.TOOL_CALL_COMPLETED in asleep[0]
            assert asleep[1]["settle"] == identity and not asleep[1].get("release")
            claim = await access.read(access.store.claims.get_claim, identity)
            assert (claim.run_id, claim.state) == (run_id, "settled")
    (first, slept), (second, _) = runs
    assert slept is RunState.SLEEPING
    [(seq, _, _)] = calls_of(await runtime.reads.log(first), "park")
    [(_, _, copied)] = calls_of(await runtime.reads.log(second), "park")
    assert copied.deduplicated_from == {"run_id": first, "seq": seq}
    assert [c["tool"] for c in fx.ledger] == ["park"]
