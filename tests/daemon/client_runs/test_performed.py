"""Calls a client performs itself: client tools (declared by the operator) and client model calls.

Every answer is validated against the OpenAPI document, and the suite checks
that every documented status of these routes was reached.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess

import pytest
import trio
from salvor.daemon.client_runs._client_tools import (
    DeclarationError,
    load_declarations,
    parse_declaration,
)
from salvor.store import EventStore

from tests.daemon.client_runs.test_client_runs import head, log_of
from tests.support.contract import CLIENT_PERFORMED_PATHS, MISSING_RUN, OVERSIZED, Contract
from tests.support.scripted_provider import ErrorReply
from tests.support.spawn import run_salvor

CHARGE = """
name = "charge_card"
effect = "write"
trust_completion = true
idempotency_key = ["order_id", "amount_cents"]
require_equal = ["amount_cents"]
[input_schema]
type = "object"
required = ["order_id", "amount_cents"]
[input_schema.properties]
order_id = { type = "string", pattern = "^o-" }
amount_cents = { type = "integer", minimum = 1 }
[output_schema]
type = "object"
required = ["charge_id", "amount_cents"]
"""
PAYOUT = """
name = "payout"
effect = "write"
require_equal = ["amount"]
[input_schema]
type = "object"
required = ["amount"]
[output_schema]
type = "object"
required = ["payout_id"]
"""
FETCH = (
    'name = "fetch"\neffect = "read"\ntrust_completion = true\n[input_schema]\ntype = "object"\n'
)


def canonical_hash(value) -> str:
    """Any canonical-JSON SHA-256 will do for ASCII keys and plain values: the
    client can check the server."""
    return (
        "sha256:"
        + hashlib.sha256(
            json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
    )


@pytest.fixture
def declarations(tmp_path):
    files = []
    for name, text in (("charge.toml", CHARGE), ("payout.toml", PAYOUT), ("fetch.toml", FETCH)):
        (tmp_path / name).write_text(text)
        files.append(str(tmp_path / name))
    return load_declarations(files)


class Driver:
    """One client-driven run and the calls a client makes on it, each
    validated against the document."""

    def __init__(self, server, contract: Contract) -> None:
        self.api, self.contract = server.client, contract

    async def open(self) -> None:
        opened = await self.contract.call(
            self.api, "POST", "/v1/client-runs", expect=201, json={"record_prompts": True}
        )
        self.run_id, self.token = opened["run"], {"X-Drive-Token": opened["drive_token"]}
        await self.contract.call(
            self.api,
            "POST",
            "/v1/client-runs/{run_id}/events",
            expect=200,
            run_id=self.run_id,
            headers=self.token,
            json={"events": [head(self.run_id)]},
        )

    async def post(self, name: str, expect: int, body=None, **kwargs):
        kwargs.setdefault("headers", self.token)
        kwargs.setdefault("run_id", self.run_id)
        if body is not None:
            kwargs["json"] = body
        return await self.contract.call(
            self.api, "POST", f"/v1/client-runs/{{run_id}}/{name}", expect=expect, **kwargs
        )

    async def kinds(self) -> list[str]:
        return [e["event"]["kind"] for e in await log_of(self.api, self.run_id)]


def test_declarations_are_strict() -> None:
    tool = parse_declaration(CHARGE, "toml")
    assert tool.to_json()["idempotency_key"] == ["order_id", "amount_cents"]
    assert "output_schema" not in parse_declaration(FETCH, "toml").to_json()
    bad = [
        ('name = "x"\neffect = "delete"\n[input_schema]\ntype = "object"\n', "`effect`"),
        ('name = "x"\neffect = "read"\n', "`input_schema` is required"),
        ('name = "x"\neffect = "read"\ncolour = 1\n[input_schema]\n', "unknown field `colour`"),
        (
            'name = "x"\neffect = "read"\ntrust_completion = "yes"\n[input_schema]\n',
            "`trust_completion`",
        ),
        (
            'name = "x"\neffect = "read"\nidempotency_key = ["a", "a"]\n[input_schema]\n',
            "`idempotency_key`",
        ),
        ('name = "x"\neffect = "read"\n[input_schema]\ntype = 7\n', "not a usable JSON schema"),
        ('effect = "read"\n[input_schema]\n', "`name`"),
        ("name = ", "not valid TOML"),
    ]
    for text, fragment in bad:
        with pytest.raises(DeclarationError, match=fragment.replace("[", r"\[")):
            parse_declaration(text, "toml")


def test_salvor_serve_refuses_a_bad_declaration_in_one_sentence(tmp_path) -> None:
    (tmp_path / "bad.toml").write_text('name = "x"\neffect = "delete"\n[input_schema]\n')
    result = run_salvor(
        [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            str(tmp_path / "s.db"),
            "--client-tool",
            str(tmp_path / "bad.toml"),
            "--client-tool",
            str(tmp_path / "gone.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "bad.toml: `effect` must be one of" in result.stderr
    assert "Traceback" not in result.stderr


async def test_client_tools_are_listed_as_declared(server_factory, declarations) -> None:
    contract = Contract()
    bare = await server_factory()
    assert await contract.call(bare.client, "GET", "/v1/client-tools", expect=200) == {
        "client_tools": []
    }
    await bare.stop()  # one daemon per store: the next one takes it over
    server = await server_factory(client_tools=declarations)
    listed = (await contract.call(server.client, "GET", "/v1/client-tools", expect=200))[
        "client_tools"
    ]
    assert [t["name"] for t in listed] == ["charge_card", "fetch", "payout"]
    assert listed[1] == {
        "name": "fetch",
        "effect": "read",
        "input_schema": {"type": "object"},
        "trust_completion": True,
    }
    assert listed[2]["trust_completion"] is False and "idempotency_key" not in listed[2]


async def test_client_performed_calls(server_factory, declarations, providers, monkeypatch) -> None:
    contract = Contract()
    provider = providers([ErrorReply(400, "no such model")])
    monkeypatch.setenv("SALVOR_MODEL_BASE_URL", provider.base_url)
    server = await server_factory(client_tools=declarations)
    run = Driver(server, contract)
    await run.open()
    run_id = run.run_id

    # -- a client tool: the key is derived by the daemon from the declared fields ------------------
    order = {"order_id": "o-1", "amount_cents": 500}
    opened = await run.post(
        "client-tool-intent", 200, {"seq": 1, "tool": "charge_card", "input": order}
    )
    key = canonical_hash(
        {"run": run_id, "tool": "charge_card", "order_id": "o-1", "amount_cents": 500}
    )
    assert opened == {"seq": 1, "idempotency_key": key, "effect": "write", "settled": False}
    assert (
        await run.post("client-tool-intent", 200, {"seq": 1, "tool": "charge_card", "input": order})
        == opened
    )
    refusals = [
        ({"seq": 3, "tool": "wire_transfer", "input": {}}, 404),
        (
            {"seq": 3, "tool": "charge_card", "input": {"order_id": "o-2"}},
            400,
        ),  # the schema's `required`
        ({"seq": 3, "tool": "charge_card", "input": {"order_id": "o-2", "amount_cents": 0}}, 400),
        ({"seq": 1, "tool": "charge_card", "input": {**order, "amount_cents": 501}}, 409),
        ({"seq": 9, "tool": "charge_card", "input": order}, 409),
    ]
    for body, status in refusals:
        await run.post("client-tool-intent", status, body)
    # `pattern` is not honoured: a comment, not a rule.
    assert (await run.kinds()) == ["RunStarted", "ToolCallRequested"]
    log = await log_of(run.api, run_id)
    assert log[1]["event"]["payload"]["performed_by"] == "client"

    completions = [
        ({"seq": 1, "output": {"charge_id": "ch_1", "amount_cents": 5000}}, 400),  # require_equal
        ({"seq": 1, "output": {"amount_cents": 500}}, 400),  # output_schema
        (
            {
                "seq": 1,
                "output": {"charge_id": "ch_1", "amount_cents": 500},
                "error": {"message": "x"},
            },
            400,
        ),
        ({"seq": 1}, 400),
        ({"seq": 1, "error": {"message": "x", "kind": "cosmic_rays"}}, 400),
        ({"seq": 3, "output": {"charge_id": "ch_1", "amount_cents": 500}}, 409),
    ]
    for body, status in completions:
        await run.post("client-tool-completion", status, body)
    assert await run.post(
        "client-tool-completion",
        200,
        {"seq": 1, "output": {"charge_id": "ch_1", "amount_cents": 500}},
    ) == {"seq": 1, "completed": True}
    settled = await run.post(
        "client-tool-intent", 200, {"seq": 1, "tool": "charge_card", "input": order}
    )
    assert settled == {
        **opened,
        "settled": True,
        "output": {"charge_id": "ch_1", "amount_cents": 500},
    }
    # The same charge asked for again later in the run: the declared key
    # dedupes, the client performs nothing.
    again = await run.post(
        "client-tool-intent", 200, {"seq": 3, "tool": "charge_card", "input": order}
    )
    assert again["settled"] is True and again["idempotency_key"] == key
    log = await log_of(run.api, run_id)
    assert log[4]["event"]["payload"]["deduplicated_from"] == {"run_id": run_id, "seq": 1}

    # A read under no declared key: keyed by its position; its failure is recorded as the sentinel.
    fetched = await run.post("client-tool-intent", 200, {"seq": 5, "tool": "fetch", "input": {}})
    assert fetched["idempotency_key"] == canonical_hash({"run": run_id, "seq": 5, "tool": "fetch"})
    await run.post(
        "client-tool-completion", 403, {"seq": 5, "output": {"rows": 1}}
    )  # no output_schema
    await run.post(
        "client-tool-completion", 200, {"seq": 5, "error": {"message": "the API timed out"}}
    )
    log = await log_of(run.api, run_id)
    assert log[-1]["event"]["payload"]["output"] == {
        "__salvor_error": {
            "is_error": True,
            "kind": "handler",
            "message": "the API timed out",
            "attempts": 1,
        }
    }

    # -- a client model call -----------------------------------------------------------------------
    request_hash = canonical_hash({"model": "m", "messages": []})
    intent = {
        "seq": 7,
        "request_hash": request_hash,
        "request_body": {"model": "m", "messages": []},
    }
    assert await run.post("client-model-intent", 200, intent) == {"seq": 7, "settled": False}
    assert await run.post("client-model-intent", 200, intent) == {"seq": 7, "settled": False}
    await run.post("client-model-intent", 409, {**intent, "request_hash": canonical_hash("other")})
    await run.post("client-model-intent", 400, {**intent, "request_hash": "md5:abc"})
    await run.post("client-model-intent", 409, {**intent, "seq": 3})
    # model-step never performs a call the log attributes to the client.
    step = await run.api.post(
        f"/v1/client-runs/{run_id}/model-step",
        headers=run.token,
        json={
            "seq": 7,
            "request": {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
            },
        },
    )
    assert step.status_code == 409 and provider.call_count == 0
    await run.post(
        "client-model-completion",
        400,
        {"seq": 7, "response": {}, "usage": {"input_tokens": -1, "output_tokens": 0}},
    )
    await run.post(
        "client-model-completion",
        409,
        {"seq": 8, "response": {}, "usage": {"input_tokens": 1, "output_tokens": 1}},
    )
    done = {
        "seq": 7,
        "response": {"content": [{"type": "text", "text": "hi"}]},
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    assert await run.post("client-model-completion", 200, done) == {"seq": 7, "completed": True}
    settled = await run.post("client-model-intent", 200, intent)
    assert settled == {
        "seq": 7,
        "settled": True,
        "response": done["response"],
        "usage": done["usage"],
    }
    log = await log_of(run.api, run_id)
    assert (
        log[7]["event"]["payload"]["request_body"] == intent["request_body"]
    )  # opened with record_prompts

    # A call salvor performed is never closed by the client.
    failed = await run.api.post(
        f"/v1/client-runs/{run_id}/model-step",
        headers=run.token,
        json={
            "seq": 9,
            "request": {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
            },
        },
    )
    assert failed.status_code == 502
    await run.post("client-model-completion", 403, {**done, "seq": 9})
    await run.post("client-model-intent", 409, {"seq": 9, "request_hash": request_hash})

    # -- a write the client may not complete: a person resolves it ---------------------------------
    untrusted = Driver(server, contract)
    await untrusted.open()
    await untrusted.post(
        "client-tool-intent", 200, {"seq": 1, "tool": "payout", "input": {"amount": 5000}}
    )
    await untrusted.post(
        "client-tool-completion", 403, {"seq": 1, "output": {"payout_id": "p", "amount": 5000}}
    )
    await untrusted.post(
        "client-tool-completion", 403, {"seq": 1, "error": {"message": "it did not land"}}
    )
    status = (await untrusted.api.get(f"/v1/runs/{untrusted.run_id}")).json()["status"]
    assert status["state"] == "needs_reconciliation"
    await untrusted.post(
        "resolve", 400, {"output": {"payout_id": "p", "amount": 50000}}
    )  # require_equal
    await untrusted.post("resolve", 400, {"output": {"amount": 5000}})  # output_schema
    resolved = await untrusted.post("resolve", 200, {"output": {"payout_id": "p", "amount": 5000}})
    assert resolved == {"run": untrusted.run_id, "resolved": True}
    await untrusted.post("resolve", 409, {"output": {}})
    # The driver kept its lease: it carries on under the same token.
    await contract.call(
        untrusted.api,
        "POST",
        "/v1/client-runs/{run_id}/events",
        expect=200,
        run_id=untrusted.run_id,
        headers=untrusted.token,
        json={
            "events": [
                {
                    **head(untrusted.run_id),
                    "seq": 3,
                    "event": {"kind": "RunCompleted", "payload": {"output": "paid"}},
                }
            ]
        },
    )

    # -- the operator's resolve checks the declaration too, and drops the lease --------------------
    third = Driver(server, contract)
    await third.open()
    await third.post(
        "client-tool-intent", 200, {"seq": 1, "tool": "payout", "input": {"amount": 70}}
    )
    operator = f"/v1/runs/{third.run_id}/resolve"
    assert (
        await third.api.post(operator, json={"output": {"payout_id": "p", "amount": 7}})
    ).status_code == 400
    assert (
        await third.api.post(operator, json={"output": {"payout_id": "p", "amount": 70}})
    ).status_code == 200
    reopened = await third.api.post("/v1/client-runs", json={"run_id": third.run_id})
    assert reopened.status_code == 200, reopened.text

    # -- the remaining statuses of the document ----------------------------------------------------
    for name in (
        "client-tool-intent",
        "client-tool-completion",
        "client-model-intent",
        "client-model-completion",
        "resolve",
    ):
        await run.post(name, 401, {"seq": 1}, headers={})
        await run.post(name, 403, {"seq": 1}, headers={"X-Drive-Token": "dt_wrong"})
        await run.post(name, 404, {"seq": 1}, run_id=MISSING_RUN)
        await run.post(name, 400, {"seq": -1})
        await run.post(
            name, 413, content=OVERSIZED, headers={**run.token, "Content-Type": "application/json"}
        )
    missed = {seen for seen in contract.unreached() if seen[0] in CLIENT_PERFORMED_PATHS}
    assert not missed, f"documented but never answered: {sorted(missed)}"


async def test_a_client_never_closes_salvors_call_and_an_undeclared_tool_is_not_resolved(
    server_factory, declarations, tmp_path
) -> None:
    from salvor.daemon.tools._registry import Tool, ToolFailed, ToolRegistry
    from salvor.protocol import Effect

    async def hang_up(args, call):
        raise ToolFailed("the line dropped", retryable=False)

    registry = ToolRegistry(
        [
            Tool(
                name="transfer",
                description="write",
                effect=Effect.WRITE,
                input_schema={"type": "object"},
                handler=hang_up,
            )
        ]
    )
    contract = Contract()
    server = await server_factory(client_tools=declarations, registry=registry)
    run = Driver(server, contract)
    await run.open()
    failed = await run.api.post(
        f"/v1/client-runs/{run.run_id}/tool-step",
        headers=run.token,
        json={"seq": 1, "tool": "transfer", "input": {}},
    )
    assert failed.status_code == 502
    refused = await run.post("client-tool-completion", 403, {"seq": 1, "output": {"ok": True}})
    assert refused["error"]["code"] == "client_completion_refused"

    # A client write left open, then the daemon comes back without that tool's declaration.
    other = Driver(server, contract)
    await other.open()
    await other.post(
        "client-tool-intent", 200, {"seq": 1, "tool": "payout", "input": {"amount": 5}}
    )
    await server.stop()
    bare = await server_factory()
    answer = await bare.client.post(
        f"/v1/runs/{other.run_id}/resolve", json={"output": {"payout_id": "p", "amount": 5}}
    )
    assert answer.status_code == 400 and "--client-tool" in answer.json()["error"]["message"]
    assert (await bare.client.get(f"/v1/runs/{other.run_id}")).json()["status"][
        "state"
    ] == "needs_reconciliation"

    # `salvor resolve` from a shell holds the same line: no declaration, no hand-recorded output.
    async def cli_resolve(output: dict, *declared: str) -> subprocess.CompletedProcess:
        flags = [arg for path in declared for arg in ("--client-tool", str(tmp_path / path))]
        args = ["resolve", other.run_id, "--store", bare.store_url, "--output", json.dumps(output)]
        run = functools.partial(run_salvor, [*args, *flags], capture_output=True)
        return await trio.to_thread.run_sync(run)

    for output, declared, fragment in (
        ({"payout_id": "p", "amount": 5}, (), "--client-tool"),
        ({"payout_id": "p", "amount": 50}, ("payout.toml",), "amount"),  # require_equal
        ({"amount": 5}, ("payout.toml",), "payout"),  # output_schema
    ):
        refused = await cli_resolve(output, *declared)
        assert refused.returncode == 1 and fragment in refused.stderr.decode(), refused.stderr
        assert refused.stderr.decode().count("\n") == 1 and b"Traceback" not in refused.stderr
    assert (await bare.client.get(f"/v1/runs/{other.run_id}")).json()["status"][
        "state"
    ] == "needs_reconciliation"
    assert (await cli_resolve({"payout_id": "p", "amount": 5}, "payout.toml")).returncode == 0
    completion = (await log_of(bare.client, other.run_id))[-1]["event"]
    assert (
        completion["kind"] == "ToolCallCompleted"
        and completion["payload"]["settled_by"] == "operator"
    )


def test_a_key_field_missing_from_the_input_is_named() -> None:
    from salvor.daemon.web._errors import OperationRefused

    tool = parse_declaration(
        'name = "refund"\neffect = "write"\nidempotency_key = ["order_id"]\n'
        '[input_schema]\ntype = "object"\n',
        "toml",
    )
    with pytest.raises(OperationRefused) as caught:
        tool.key("run", 3, {"amount": 5})
    assert caught.value.code == "bad_request" and "`order_id`" in caught.value.message


async def test_a_client_tool_completion_reporting_an_error_releases_its_declared_key(
    server_factory, declarations
) -> None:
    contract = Contract()
    server = await server_factory(client_tools=declarations)
    run = Driver(server, contract)
    await run.open()
    order = {"order_id": "o-1", "amount_cents": 500}
    opened = await run.post(
        "client-tool-intent", 200, {"seq": 1, "tool": "charge_card", "input": order}
    )
    await run.post(
        "client-tool-completion", 200, {"seq": 1, "error": {"message": "the card was declined"}}
    )
    key = opened["idempotency_key"]

    async def claim():
        def read():
            with EventStore.open(server.store_url) as store:
                return store.claims.get_claim(key)

        return await trio.to_thread.run_sync(read)

    assert await claim() is None

    # The same charge asked for again: the failure is not copied, the client performs it afresh.
    again = await run.post(
        "client-tool-intent", 200, {"seq": 3, "tool": "charge_card", "input": order}
    )
    assert again == {**opened, "seq": 3, "settled": False}
    held = await claim()
    assert (held.seq, held.state) == (3, "open")
    charged = {"charge_id": "ch_1", "amount_cents": 500}
    await run.post("client-tool-completion", 200, {"seq": 3, "output": charged})
    settled = await claim()
    assert (settled.seq, settled.state, settled.output) == (3, "settled", charged)
    # A success is what a later call of the key copies.
    copied = await run.post(
        "client-tool-intent", 200, {"seq": 5, "tool": "charge_card", "input": order}
    )
    assert copied["settled"] is True and copied["output"] == charged
    log = await log_of(run.api, run.run_id)
    assert log[3]["event"]["payload"].get("deduplicated_from") is None
    assert log[6]["event"]["payload"]["deduplicated_from"] == {"run_id": run.run_id, "seq": 3}
