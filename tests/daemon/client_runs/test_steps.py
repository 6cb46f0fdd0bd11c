"""Server-performed steps of client-driven runs: model-step and tool-step over real HTTP.

The model is the scripted provider (the daemon's executor is aimed at it
with ``SALVOR_MODEL_BASE_URL``); the tools are real tools in this process
whose executions the test counts.
"""

from __future__ import annotations

import json

import pytest
from salvor.daemon.tools._registry import Tool, ToolFailed, ToolRegistry
from salvor.protocol import Effect

from tests.daemon.client_runs.test_client_runs import append, code, head, log_of, open_run
from tests.support.api import snapshot
from tests.support.scripted_provider import ErrorReply, text_reply

REQUEST = {
    "model": "scripted-model",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hello"}],
}
ANY_OBJECT = {"type": "object"}


class Counted:
    """Tools whose executions are counted: a read, a write, a read that
    fails twice, a write that fails."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.flaky_failures = 5

    def registry(self) -> ToolRegistry:
        async def lookup(args, call):
            self.calls.append(("lookup", args))
            return {"amount": 42, "key": call.idempotency_key}

        async def charge(args, call):
            self.calls.append(("charge", args))
            return {"charge_id": "ch_1"}

        async def flaky_read(args, call):
            self.calls.append(("flaky_read", args))
            if self.flaky_failures > 0:
                self.flaky_failures -= 1
                raise ToolFailed("the ledger is busy")
            return {"ok": True}

        async def broken_write(args, call):
            self.calls.append(("broken_write", args))
            raise ToolFailed("the card network hung up")

        schema = {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}
        return ToolRegistry(
            [
                Tool(
                    name="lookup",
                    description="read",
                    effect=Effect.READ,
                    input_schema=schema,
                    handler=lookup,
                ),
                Tool(
                    name="charge",
                    description="write",
                    effect=Effect.WRITE,
                    input_schema=schema,
                    handler=charge,
                ),
                Tool(
                    name="flaky_read",
                    description="read",
                    effect=Effect.READ,
                    input_schema=ANY_OBJECT,
                    handler=flaky_read,
                ),
                Tool(
                    name="broken_write",
                    description="write",
                    effect=Effect.WRITE,
                    input_schema=ANY_OBJECT,
                    handler=broken_write,
                ),
            ]
        )


async def started(client) -> tuple[str, dict]:
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    assert (await append(client, run_id, token, [head(run_id)])).status_code == 200
    return run_id, {"X-Drive-Token": token}


async def test_a_model_step_is_performed_once_and_answered_from_the_log_on_retry(
    server_factory, providers, monkeypatch
) -> None:
    provider = providers([text_reply("hi there")])
    monkeypatch.setenv("SALVOR_MODEL_BASE_URL", provider.base_url)
    server = await server_factory()
    client = server.client
    opened = await open_run(client, None)
    run_id = opened["run"]
    token = {"X-Drive-Token": opened["drive_token"]}
    await append(client, run_id, opened["drive_token"], [head(run_id)])
    step = f"/v1/client-runs/{run_id}/model-step"
    answer = await client.post(step, json={"seq": 1, "request": REQUEST}, headers=token)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["response"]["content"] == [{"type": "text", "text": "hi there"}]
    assert body["usage"] == {"input_tokens": 10, "output_tokens": 5}
    # The tab resends: the recorded completion comes back, the provider is not paid again.
    again = await client.post(step, json={"seq": 1, "request": REQUEST}, headers=token)
    assert again.json() == body and provider.call_count == 1
    kinds = [e["event"]["kind"] for e in await log_of(client, run_id)]
    assert kinds == ["RunStarted", "ModelCallRequested", "ModelCallCompleted"]
    assert "request_body" not in (await log_of(client, run_id))[1]["event"]["payload"]
    refusals = [
        (
            {"seq": 1, "request": {**REQUEST, "max_tokens": 65}},
            (409, "divergence"),
        ),  # another request there
        ({"seq": 0, "request": REQUEST}, (409, "divergence")),  # not a model event there
        ({"seq": 9, "request": REQUEST}, (409, "divergence")),  # beyond the end
        ({"seq": 3, "request": {**REQUEST, "temperature": 1}}, (400, "bad_request")),
        ({"seq": 3, "request": {**REQUEST, "messages": []}}, (400, "bad_request")),
        ({"seq": -1, "request": REQUEST}, (400, "bad_request")),
        ({"request": REQUEST}, (400, "bad_request")),
    ]
    for payload, expected in refusals:
        assert code(await client.post(step, json=payload, headers=token)) == expected, payload
    assert code(await client.post(step, json={"seq": 3, "request": REQUEST})) == (
        401,
        "missing_drive_token",
    )
    assert len(await log_of(client, run_id)) == 3 and provider.call_count == 1


async def test_a_failed_model_step_leaves_its_intent_open_and_the_retry_completes_it(
    server_factory, providers, monkeypatch
) -> None:
    provider = providers([ErrorReply(400, "model is warming up"), text_reply("ready")])
    monkeypatch.setenv("SALVOR_MODEL_BASE_URL", provider.base_url)
    server = await server_factory()
    client = server.client
    opened = (await client.post("/v1/client-runs", json={"record_prompts": True})).json()
    run_id, token = opened["run"], {"X-Drive-Token": opened["drive_token"]}
    # The holder's re-open keeps what the lease was opened with.
    await client.post(
        "/v1/client-runs", json={"run_id": run_id, "record_prompts": False}, headers=token
    )
    await append(client, run_id, opened["drive_token"], [head(run_id)])
    step = f"/v1/client-runs/{run_id}/model-step"
    failed = await client.post(step, json={"seq": 1, "request": REQUEST}, headers=token)
    assert (
        code(failed) == (502, "model_execution")
        and "warming up" in failed.json()["error"]["message"]
    )
    assert (await client.get(f"/v1/runs/{run_id}")).json()["status"]["state"] == "awaiting_model"
    retried = await client.post(step, json={"seq": 1, "request": REQUEST}, headers=token)
    assert (
        retried.status_code == 200 and retried.json()["response"]["content"][0]["text"] == "ready"
    )
    log = await log_of(client, run_id)
    assert [e["event"]["kind"] for e in log] == [
        "RunStarted",
        "ModelCallRequested",
        "ModelCallCompleted",
    ]
    assert log[2]["event"]["payload"]["seq"] == 1
    assert (
        log[1]["event"]["payload"]["request_body"] == REQUEST
    )  # record_prompts kept from the open


async def test_without_a_model_the_step_is_refused_before_anything_is_recorded(
    server, monkeypatch
) -> None:
    client = server.client
    run_id, token = await started(client)
    response = await client.post(
        f"/v1/client-runs/{run_id}/model-step", json={"seq": 1, "request": REQUEST}, headers=token
    )
    assert code(response) == (503, "model_executor_unavailable")
    assert len(await log_of(client, run_id)) == 1


async def test_a_daemon_wired_with_no_tool_registry_refuses_tools_as_unavailable(
    server_factory,
) -> None:
    """Empty (``salvor serve``'s) and absent are two answers: the tool is unknown to the one,
    and the other has no tools to ask; neither records anything."""
    lookup = {"seq": 1, "tool": "lookup_invoice", "input": {"invoice": "INV-1"}}
    graph = {
        "schema_version": 1,
        "nodes": [{"id": "look", "kind": "tool", "tool": "lookup_invoice", "input": "$input"}],
        "edges": [],
    }
    answers = []
    for registry in (ToolRegistry.unwired(), None):
        server = await server_factory(registry=registry, demo_tools=False)
        client = server.client
        run_id, token = await started(client)
        step = await client.post(f"/v1/client-runs/{run_id}/tool-step", json=lookup, headers=token)
        assert len(await log_of(client, run_id)) == 1
        submitted = await client.post("/v1/graphs", json=graph)
        before = await snapshot(server)
        started_graph = await client.post(
            "/v1/graph-runs", json={"graph_hash": submitted.json()["graph"], "input": {}}
        )
        assert await snapshot(server) == before
        answers.append((code(step), code(started_graph), started_graph.json()["error"]))
        await server.stop()
    (unwired_step, unwired_graph, why), (empty_step, empty_graph, _) = answers
    assert unwired_step == unwired_graph == (503, "tool_registry_unavailable")
    assert why["details"] == {"node": "look", "tool": "lookup_invoice"}
    assert empty_step == empty_graph == (404, "unknown_tool")
    with pytest.raises(ValueError, match="no registry is wired"):
        ToolRegistry.unwired().register(Counted().registry().get("lookup"))


@pytest.fixture
def counted() -> Counted:
    return Counted()


async def test_tool_steps_follow_the_effect_table(server_factory, counted) -> None:
    server = await server_factory(registry=counted.registry())
    client = server.client
    run_id, token = await started(client)
    step = f"/v1/client-runs/{run_id}/tool-step"

    async def call(payload: dict):
        return await client.post(step, json=payload, headers=token)

    read = {
        "seq": 1,
        "tool": "lookup",
        "input": {"id": "INV-1"},
        "idempotency_key": None,
        "effect": "write",
    }
    assert (await call(read)).json() == {"output": {"amount": 42, "key": None}}
    assert (await call(read)).json() == {"output": {"amount": 42, "key": None}}  # from the log
    log = await log_of(client, run_id)
    assert log[1]["event"]["payload"]["effect"] == "read"  # the registration's, not the client's
    assert (await call({"seq": 3, "tool": "charge", "input": {"id": "o-1"}})).json() == {
        "output": {"charge_id": "ch_1"}
    }
    assert (await call({"seq": 3, "tool": "charge", "input": {"id": "o-1"}})).json() == {
        "output": {"charge_id": "ch_1"}
    }
    assert counted.calls == [("lookup", {"id": "INV-1"}), ("charge", {"id": "o-1"})]
    refusals = [
        ({"seq": 3, "tool": "charge", "input": {"id": "o-2"}}, (409, "divergence")),
        (
            {"seq": 1, "tool": "lookup", "input": {"id": "INV-1"}, "idempotency_key": "k"},
            (409, "divergence"),
        ),
        ({"seq": 7, "tool": "lookup", "input": {"id": "x"}}, (409, "divergence")),
        ({"seq": 5, "tool": "teleport", "input": {}}, (404, "unknown_tool")),
        ({"seq": 5, "tool": "lookup", "input": {"id": 7}}, (400, "bad_request")),
        (
            {"seq": 5, "tool": "lookup", "input": {"id": "x"}, "idempotency_key": ""},
            (400, "bad_request"),
        ),
    ]
    for payload, expected in refusals:
        assert code(await call(payload)) == expected, payload
    assert len(await log_of(client, run_id)) == 5 and len(counted.calls) == 2

    # A read that keeps failing is retried within the step, then left
    # open; the next step re-executes it.
    failed = await call({"seq": 5, "tool": "flaky_read", "input": {}})
    assert (
        code(failed) == (502, "tool_execution")
        and "the ledger is busy" in failed.json()["error"]["message"]
    )
    assert (await call({"seq": 5, "tool": "flaky_read", "input": {}})).json() == {
        "output": {"ok": True}
    }
    assert [name for name, _ in counted.calls].count(
        "flaky_read"
    ) == 6  # 3 + 3 attempts (the sixth succeeded)

    # A write that fails is tried once and then needs a person: it may have landed.
    failed = await call({"seq": 7, "tool": "broken_write", "input": {"amount": 5}})
    assert code(failed) == (502, "tool_execution")
    parked = await call({"seq": 7, "tool": "broken_write", "input": {"amount": 5}})
    assert code(parked) == (409, "needs_reconciliation")
    assert parked.json()["error"]["details"]["intent"]["tool"] == "broken_write"
    assert [name for name, _ in counted.calls].count("broken_write") == 1
    state = (await client.get(f"/v1/runs/{run_id}")).json()
    assert state["status"]["state"] == "needs_reconciliation" and state["driver"] == "attached"
    # The operator records what happened; the dead driver's lease goes with it,
    # so a new driver opens at once.
    resolved = await client.post(f"/v1/runs/{run_id}/resolve", json={"output": {"charged": False}})
    assert resolved.status_code == 200, resolved.text
    reopened = await open_run(client, run_id, expect=200)
    assert reopened["log"][-1]["event"]["payload"] == {
        "seq": 7,
        "output": {"charged": False},
        "settled_by": "operator",
    }
    assert json.dumps(reopened["log"]).count("ToolCallCompleted") == 4


async def test_step_responses_match_the_document(
    server_factory, providers, counted, monkeypatch
) -> None:
    from tests.support.contract import MISSING_RUN, OVERSIZED, STEP_PATHS, Contract

    contract = Contract()
    bare = await server_factory()  # no model configured
    run_id, token = await started(bare.client)
    model, tool = STEP_PATHS
    await contract.call(
        bare.client,
        "POST",
        model,
        expect=503,
        run_id=run_id,
        headers=token,
        json={"seq": 1, "request": REQUEST},
    )
    await bare.stop()  # one daemon per store: the next one takes it over

    unwired = await server_factory(registry=ToolRegistry.unwired(), demo_tools=False)
    run_id, token = await started(unwired.client)
    await contract.call(
        unwired.client,
        "POST",
        tool,
        expect=503,
        run_id=run_id,
        headers=token,
        json={"seq": 1, "tool": "lookup_invoice", "input": {"invoice": "INV-1"}},
    )
    await unwired.stop()

    provider = providers([text_reply("hi"), ErrorReply(400, "no such model")])
    monkeypatch.setenv("SALVOR_MODEL_BASE_URL", provider.base_url)
    server = await server_factory(registry=counted.registry())
    api = server.client
    run_id, token = await started(api)
    call = contract.call
    await call(
        api,
        "POST",
        model,
        expect=200,
        run_id=run_id,
        headers=token,
        json={"seq": 1, "request": REQUEST},
    )
    await call(
        api,
        "POST",
        model,
        expect=409,
        run_id=run_id,
        headers=token,
        json={"seq": 0, "request": REQUEST},
    )
    await call(
        api, "POST", model, expect=400, run_id=run_id, headers=token, json={"seq": 3, "request": {}}
    )
    await call(api, "POST", model, expect=401, run_id=run_id, json={"seq": 3, "request": REQUEST})
    await call(
        api,
        "POST",
        model,
        expect=403,
        run_id=run_id,
        headers={"X-Drive-Token": "dt_x"},
        json={"seq": 3, "request": REQUEST},
    )
    await call(
        api,
        "POST",
        model,
        expect=404,
        run_id=MISSING_RUN,
        headers=token,
        json={"seq": 3, "request": REQUEST},
    )
    await call(
        api,
        "POST",
        model,
        expect=502,
        run_id=run_id,
        headers=token,
        json={"seq": 3, "request": {**REQUEST, "model": "gone"}},
    )
    # That run now has a model intent open at seq 3; the tool steps take a run of their own.
    run_id, token = await started(api)
    await call(
        api,
        "POST",
        tool,
        expect=200,
        run_id=run_id,
        headers=token,
        json={"seq": 1, "tool": "lookup", "input": {"id": "a"}},
    )
    await call(
        api,
        "POST",
        tool,
        expect=409,
        run_id=run_id,
        headers=token,
        json={"seq": 1, "tool": "lookup", "input": {"id": "b"}},
    )
    await call(
        api,
        "POST",
        tool,
        expect=400,
        run_id=run_id,
        headers=token,
        json={"seq": 3, "tool": "lookup"},
    )
    await call(
        api, "POST", tool, expect=404, run_id=run_id, headers=token, json={"seq": 3, "tool": "nope"}
    )
    await call(api, "POST", tool, expect=401, run_id=run_id, json={"seq": 3, "tool": "lookup"})
    await call(
        api,
        "POST",
        tool,
        expect=403,
        run_id=run_id,
        headers={"X-Drive-Token": "dt_x"},
        json={"seq": 3, "tool": "lookup"},
    )
    await call(
        api,
        "POST",
        tool,
        expect=502,
        run_id=run_id,
        headers=token,
        json={"seq": 3, "tool": "broken_write", "input": {}},
    )
    for path in STEP_PATHS:
        await call(
            api,
            "POST",
            path,
            expect=413,
            run_id=run_id,
            headers={**token, "Content-Type": "application/json"},
            content=OVERSIZED,
        )
    missed = {seen for seen in contract.unreached() if seen[0] in STEP_PATHS}
    assert not missed, f"documented but never answered: {sorted(missed)}"


def frames_of(text: str) -> list[tuple[str, dict]]:
    frames = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if fields:
            frames.append((fields["event"], json.loads(fields["data"])))
    return frames


async def test_a_streamed_model_step_ticks_then_completes_and_records_what_the_plain_one_does(
    server_factory, providers, monkeypatch
) -> None:
    provider = providers(
        [
            text_reply("the plan is simple"),
            text_reply("the plan is simple"),
            ErrorReply(400, "nope"),
        ]
    )
    monkeypatch.setenv("SALVOR_MODEL_BASE_URL", provider.base_url)
    server = await server_factory()
    client = server.client
    streamed_run, streamed = await started(client)
    plain_run, plain = await started(client)
    step = "/v1/client-runs/{}/model-step"
    response = await client.post(
        step.format(streamed_run),
        json={"seq": 1, "request": REQUEST},
        headers={**streamed, "Accept": "text/event-stream"},
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "text/event-stream"
    )
    frames = frames_of(response.text)
    deltas = [data for name, data in frames if name == "delta"]
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == "the plan is simple"
    assert len([d for d in deltas if d["type"] == "text_delta"]) > 1  # it ticked, not one lump
    assert [name for name, _ in frames][-1] == "complete"
    complete = frames[-1][1]
    plain_answer = (
        await client.post(
            step.format(plain_run), json={"seq": 1, "request": REQUEST}, headers=plain
        )
    ).json()
    assert complete == plain_answer
    # Byte for byte the same completion, whichever way it was asked for.
    assert (await log_of(client, streamed_run))[2]["event"] == (await log_of(client, plain_run))[2][
        "event"
    ]
    # A replayed step streams one complete frame and calls nothing.
    again = await client.post(
        step.format(streamed_run) + "?stream=1",
        json={"seq": 1, "request": REQUEST},
        headers=streamed,
    )
    assert frames_of(again.text) == [("complete", complete)] and provider.call_count == 2
    # A provider failure is an error frame; the intent stays open for a retry.
    failed = await client.post(
        step.format(streamed_run) + "?stream=1",
        headers=streamed,
        json={"seq": 3, "request": {**REQUEST, "model": "other"}},
    )
    assert (
        frames_of(failed.text)[-1][0] == "error"
        and frames_of(failed.text)[-1][1]["code"] == "model_execution"
    )
    assert (await client.get(f"/v1/runs/{streamed_run}")).json()["status"][
        "state"
    ] == "awaiting_model"
    # Refusals come before any stream, as the error envelope.
    refused = await client.post(
        step.format(streamed_run) + "?stream=1",
        headers=streamed,
        json={"seq": 9, "request": REQUEST},
    )
    assert code(refused) == (409, "divergence")
