"""Notifications under the real daemon (in-process ``serve``) and the command line.

A daemon started with a webhook writes outbox rows as its runs wait on a person, and delivers
them beside its runs, never in their way: a run answers its gate and completes while the
webhook hangs. A daemon without one, and ``salvor run``, write none. Nothing over HTTP reads or
sets where notifications go.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from salvor.daemon.notify import NotifyConfig
from salvor.daemon.tools import OutcomeUnknown, Tool, ToolRegistry
from salvor.protocol import Effect
from salvor.store import EventStore

from tests.support.api_server import agent_toml
from tests.support.backends import BOTH, SQLITE_ONLY
from tests.support.cli import salvor_in_process
from tests.support.flows import tool_use
from tests.support.scripted_provider import text_reply, tool_loop_script
from tests.support.webhook_receiver import WebhookReceiver

# The outbox's writes are the store's, tested on both backends there and in the kill test;
# whether a daemon without a target, or `salvor run`, writes any is checked on both here too.
STORE_BACKENDS = SQLITE_ONLY
EVERY_BACKEND = pytest.mark.parametrize("store_url", BOTH, indirect=True)

REPO = Path(__file__).resolve().parents[3]
QUESTION = {"question": "Which size?", "type": "select", "options": ["S", "M"]}


def outbox(store_url: str) -> list:
    with EventStore.open(store_url) as store:
        return store.outbox.entries()


async def test_a_run_answers_its_gate_and_completes_while_the_webhook_hangs(
    server_factory, providers, store_url: str
) -> None:
    provider = providers(tool_loop_script([("request_approval", {})], final_text="approved"))
    with WebhookReceiver([200]) as receiver:
        receiver.hold()  # it takes the POST and answers nothing
        server = await server_factory(notify=NotifyConfig(webhook=receiver.url, timeout=60))
        agent = await server.register_agent(
            agent_toml(provider.base_url, tools=["request_approval"])
        )
        run_id = await server.start_run(agent, "refund INV-1")
        waiting = await server.wait_resting(run_id)
        assert waiting["status"]["state"] == "suspended"
        assert await trio.to_thread.run_sync(receiver.wait_for, 1, 20.0)

        resumed = await server.client.post(
            f"/v1/runs/{run_id}/resume", json={"input": {"approved": True}}
        )
        assert resumed.status_code == 202, resumed.text
        done = await server.wait_resting(run_id)
        assert done["status"]["state"] == "completed"
        assert receiver.answered == []  # still hanging: the run never waited for it
        await server.stop()
    (row,) = outbox(store_url)
    assert (row.run_id, row.kind, row.delivered_at) == (run_id, "gate", None)
    assert receiver.requests[0].body == row.body.encode()


async def test_an_ask_user_question_is_told_as_a_question(
    server_factory, providers, store_url: str
) -> None:
    def ask_then_echo(call):
        results = [
            b for m in call.request["messages"] for b in m["content"] if b["type"] == "tool_result"
        ]
        return text_reply("thanks") if results else tool_use("ask_user", QUESTION)

    provider = providers(ask_then_echo)
    with WebhookReceiver([200]) as receiver:
        server = await server_factory(notify=NotifyConfig(webhook=receiver.url))
        agent = await server.register_agent(
            agent_toml(provider.base_url, extra='flow_tools = ["ask_user"]')
        )
        run_id = await server.start_run(agent, "order a shirt")
        assert (await server.wait_resting(run_id))["status"]["state"] == "suspended"
        assert await trio.to_thread.run_sync(lambda: receiver.wait_for(1, 20.0, answered=True))
        await server.stop()
    body = receiver.requests[0].json()
    assert (body["kind"], body["run"]) == ("question", run_id)
    assert body["status"]["reason"] == "Which size?"
    (row,) = outbox(store_url)
    assert row.delivered_at is not None


@EVERY_BACKEND
async def test_a_daemon_without_a_target_writes_no_row(server, providers, store_url) -> None:
    provider = providers(tool_loop_script([("request_approval", {})]))
    agent = await server.register_agent(agent_toml(provider.base_url, tools=["request_approval"]))
    run_id = await server.start_run(agent, "refund INV-2")
    assert (await server.wait_resting(run_id))["status"]["state"] == "suspended"
    await server.stop()
    assert outbox(store_url) == []


async def test_nothing_over_http_names_notifications(server) -> None:
    from salvor.daemon.api import create_app

    app = create_app(server.state)
    rules = " ".join(rule.rule for rule in app.url_map.iter_rules()).lower()
    document = (await server.client.get("/v1/openapi.json")).text.lower()
    for word in ("notif", "webhook", "secret_env"):
        assert word not in rules and word not in document, word


@EVERY_BACKEND
def test_salvor_run_writes_no_row(store_url: str, tmp_path: Path, providers) -> None:
    provider = providers(tool_loop_script([("request_approval", {})]))
    path = tmp_path / "gate.toml"
    path.write_text(agent_toml(provider.base_url, tools=["request_approval"]))
    env = {**os.environ, "SALVOR_STORE": store_url}
    env.pop("SALVOR_FAULT_KILL_AFTER_SEQ", None)
    done = salvor_in_process("run", str(path), env=env, cwd=REPO)
    run_id = done.stdout.splitlines()[0]
    with EventStore.open(store_url) as store:
        assert store.read_view(run_id).state.value == "suspended"
    assert outbox(store_url) == []


def serve_refusal(*flags: str, env: dict | None = None):
    full = {**os.environ, **(env or {})}
    return salvor_in_process("serve", "--listen", "127.0.0.1:0", *flags, env=full, cwd=REPO)


def test_serve_refuses_a_webhook_that_is_not_http_in_one_sentence(store_url: str) -> None:
    refused = serve_refusal("--store", store_url, "--notify-webhook", "file:///etc/passwd")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "salvor: --notify-webhook 'file:///etc/passwd' must be an http:// or https:// URL"
    ]
    assert refused.stdout == ""


def test_serve_refuses_a_secret_variable_that_is_not_set(store_url: str) -> None:
    refused = serve_refusal(
        "--store",
        store_url,
        "--notify-webhook",
        "http://127.0.0.1:9/hook",
        "--notify-secret-env",
        "SALVOR_NOTIFY_UNSET_FOR_TESTS",
    )
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert "SALVOR_NOTIFY_UNSET_FOR_TESTS, but that environment variable is not set" in line


def test_the_flags_make_the_config_and_the_secret_stays_in_memory(monkeypatch) -> None:
    from salvor.daemon.cli._parser import command_parser
    from salvor.daemon.cli._serve_command import serve_config as _serve_config

    monkeypatch.setenv("HOOK_SECRET", "hunter2")
    args = command_parser().parse_args(
        [
            "serve",
            "--notify-webhook",
            "https://hooks.example/salvor",
            "--notify-command",
            "page-me --team 'on call'",
            "--notify-secret-env",
            "HOOK_SECRET",
        ]
    )
    config = _serve_config(args, "sqlite:///unused.db")
    assert config.notify == NotifyConfig(
        webhook="https://hooks.example/salvor",
        command=("page-me", "--team", "on call"),
        secret=b"hunter2",
    )
    assert "hunter2" not in repr(config)
    unset = _serve_config(command_parser().parse_args(["serve"]), "sqlite:///unused.db")
    assert unset.notify is None
    assert json.dumps(vars(args)).count("hunter2") == 0


def write_tools(release: trio.Event) -> ToolRegistry:
    """A write that hangs until ``release`` and then loses its answer, and one that lands."""

    async def wire(args: dict, call) -> dict:
        await release.wait()
        raise OutcomeUnknown("the bank hung up")

    async def note(args: dict, call) -> dict:
        return {"noted": True}

    schema = {"type": "object", "properties": {}}
    return ToolRegistry(
        [
            Tool(
                name="wire", description="", effect=Effect.WRITE, input_schema=schema, handler=wire
            ),
            Tool(
                name="note", description="", effect=Effect.WRITE, input_schema=schema, handler=note
            ),
        ]
    )


async def test_an_unknown_write_is_told_once_its_run_parks_and_a_landed_one_never(
    server_factory, providers, store_url: str
) -> None:
    release = trio.Event()
    provider = providers(tool_loop_script([("note", {}), ("wire", {})]))
    with WebhookReceiver([200]) as receiver:
        server = await server_factory(
            registry=write_tools(release), notify=NotifyConfig(webhook=receiver.url)
        )
        agent = await server.register_agent(agent_toml(provider.base_url, tools=["note", "wire"]))
        run_id = await server.start_run(agent, "pay INV-3")
        # The wire's intent is recorded and its handler holds: the log says needs_reconciliation,
        # but its driver is performing it. The deliverer looks, and postpones.
        with trio.fail_after(20):
            while True:
                rows = await trio.to_thread.run_sync(outbox, store_url)
                wires = [r for r in rows if r.kind == "unknown_write" and r.seq > 2]
                if wires and wires[0].next_attempt_at > wires[0].created_at:
                    break
                await trio.sleep(0.01)
        assert receiver.requests == []
        release.set()
        parked = await server.wait_resting(run_id)
        assert parked["status"]["state"] == "needs_reconciliation"
        assert await trio.to_thread.run_sync(lambda: receiver.wait_for(1, 20.0, answered=True))
        # The note's row comes due with its recheck too: its write landed, so it is withdrawn.
        with trio.fail_after(20):
            while len(await trio.to_thread.run_sync(outbox, store_url)) > 1:
                await trio.sleep(0.01)
        await server.stop()
    (request,) = receiver.requests
    body = request.json()
    (row,) = outbox(store_url)
    assert (body["kind"], body["run"], body["seq"]) == ("unknown_write", run_id, row.seq)
    assert body["status"] == {"state": "needs_reconciliation"}
    assert row.delivered_at is not None and row.attempts == 0
