"""Process agents: real SDK clients as local processes, recorded through the loopback proxy.

Each agent is a small script run with this interpreter, using the real
``openai`` or ``anthropic`` SDK against the base URLs salvor injects; the
scripted provider is the upstream. A run records every call, survives a
SIGKILL of its process by replay (no completed call served twice), and fails
clearly when the process never reaches the proxy.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import httpx
import pytest
import trio
from salvor.daemon.agents._definition import DefinitionError, parse_definition
from salvor.daemon.proxies import open_model_proxy
from salvor.daemon.recording._run_context import DriveInterrupted

from tests.support.backends import SQLITE_ONLY
from tests.support.scripted_provider import ErrorReply, FailedResponse, tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is process agents through the model
# proxy (BACKEND_MODES keeps two formats on PostgreSQL).
STORE_BACKENDS = SQLITE_ONLY

SECRET = "sk-upstream-SECRET-7f3a9c"
PLAN = [("lookup_invoice", {"invoice": "A-1"}), ("lookup_invoice", {"invoice": "B-2"})]

AGENT = r'''
import json, os, signal, sys
from pathlib import Path

mode = sys.argv[1]
Path(os.environ["PIDFILE"]).write_text(str(os.getpid()))
prompt = os.environ["SALVOR_PROMPT"]
model = (
    Path(os.environ["MODELFILE"]).read_text().strip()
    if os.environ.get("MODELFILE")
    else "scripted-model"
)
die_after = int(os.environ.get("DIE_AFTER", "0"))
marker = Path(os.environ.get("MARKER", "/nonexistent/marker"))
calls = 0
exit_file = Path(os.environ.get("EXITFILE", "/nonexistent/exit"))
exit_after = int(exit_file.read_text()) if exit_file.exists() else 0
amount = int(os.environ.get("AMOUNT", "42"))  # what the (pretend) tool returns


def after_call():
    global calls
    calls += 1
    if exit_after and calls == exit_after:
        sys.exit(0)
    if die_after and calls == die_after and not marker.exists():
        marker.write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)


if mode.startswith("openai-responses"):
    import openai

    client = openai.OpenAI(max_retries=int(os.environ.get("RETRIES", "0")))
    tools = [
        {
            "type": "function",
            "name": "lookup_invoice",
            "description": "Look up an invoice.",
            "parameters": {"type": "object", "properties": {"invoice": {"type": "string"}}},
        }
    ]
    items = [{"role": "user", "content": prompt}]

    def ask():
        """The output items of one model call; None when the model failed to answer."""
        if mode == "openai-responses":
            reply = client.responses.create(model=model, input=items, tools=tools)
            return (
                None
                if reply.status == "failed"
                else [o.model_dump(exclude_none=True) for o in reply.output]
            )
        # Build the output items from the deltas, as a streaming agent would.
        acc = {}
        for ev in client.responses.create(model=model, input=items, tools=tools, stream=True):
            if ev.type == "response.failed":
                return None
            if ev.type == "response.output_item.added":
                acc[ev.output_index] = ev.item.model_dump(exclude_none=True)
            elif ev.type == "response.content_part.added":
                acc[ev.output_index]["content"].append(ev.part.model_dump(exclude_none=True))
            elif ev.type == "response.output_text.delta":
                acc[ev.output_index]["content"][ev.content_index]["text"] += ev.delta
            elif ev.type == "response.function_call_arguments.delta":
                acc[ev.output_index]["arguments"] += ev.delta
        return [acc[i] for i in sorted(acc)]

    while True:
        output, retries = ask(), int(os.environ.get("RETRIES", "0"))
        while output is None and retries:
            output, retries = ask(), retries - 1
        if output is None:
            sys.exit("the model failed to answer")
        after_call()
        calls_ = [o for o in output if o["type"] == "function_call"]
        if not calls_:
            print(
                "".join(p["text"] for o in output if o["type"] == "message" for p in o["content"])
            )
            break
        items += output
        for c in calls_:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": c["call_id"],
                    "output": json.dumps({"amount": amount}),
                }
            )
elif mode.startswith("openai"):
    import openai

    client = openai.OpenAI(max_retries=int(os.environ.get("RETRIES", "0")))
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_invoice",
                "description": "Look up an invoice.",
                "parameters": {"type": "object", "properties": {"invoice": {"type": "string"}}},
            },
        }
    ]
    messages = [{"role": "user", "content": prompt}]
    while True:
        if mode == "openai":
            reply = client.chat.completions.create(model=model, messages=messages, tools=tools)
            message = reply.choices[0].message
            text = message.content or ""
            calls_ = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in message.tool_calls or []
            ]
        else:
            stream = client.chat.completions.create(
                model=model,
                messages=messages,
                tools=tools,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, acc = "", {}
            for chunk in stream:
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                text += delta.content or ""
                for c in delta.tool_calls or []:
                    e = acc.setdefault(
                        c.index,
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    if c.id:
                        e["id"] = c.id
                    if c.function and c.function.name:
                        e["function"]["name"] += c.function.name
                    if c.function and c.function.arguments:
                        e["function"]["arguments"] += c.function.arguments
            calls_ = [acc[i] for i in sorted(acc)]
        after_call()
        if not calls_:
            print(text)
            break
        messages.append({"role": "assistant", "content": text or None, "tool_calls": calls_})
        for c in calls_:
            messages.append(
                {"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"amount": amount})}
            )
else:
    import anthropic

    client = anthropic.Anthropic(max_retries=int(os.environ.get("RETRIES", "0")))
    tools = [
        {
            "name": "lookup_invoice",
            "description": "Look up an invoice.",
            "input_schema": {"type": "object", "properties": {"invoice": {"type": "string"}}},
        }
    ]
    messages = [{"role": "user", "content": prompt}]
    while True:
        if mode == "anthropic":
            reply = client.messages.create(
                model=model, max_tokens=256, messages=messages, tools=tools
            )
        else:
            with client.messages.stream(
                model=model, max_tokens=256, messages=messages, tools=tools
            ) as stream:
                reply = stream.get_final_message()
        after_call()
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            print("".join(b.text for b in reply.content if b.type == "text"))
            break
        blocks = []
        for b in reply.content:
            if b.type == "text":
                blocks.append({"type": "text", "text": b.text})
            else:
                blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
        messages.append({"role": "assistant", "content": blocks})
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": u.id,
                        "content": json.dumps({"amount": amount}),
                    }
                    for u in uses
                ],
            }
        )
'''

MODES = [
    "openai",
    "openai-stream",
    "openai-responses",
    "openai-responses-stream",
    "anthropic",
    "anthropic-stream",
]
# Every wire format on SQLite; on PostgreSQL one plain and one streamed: the store sees the same
# appends whatever the format, and each format's own recording and replay is the SQLite half's
# to show.
BACKEND_MODES = [("sqlite", mode) for mode in MODES] + [
    ("postgres", mode) for mode in ("openai-responses", "anthropic-stream")
]


def process_agent(
    tmp_path: Path,
    mode: str = "openai",
    *,
    env: dict | None = None,
    extra: str = "",
    script: str | None = None,
):
    path = tmp_path / "agent.py"
    path.write_text(script if script is not None else AGENT)
    env = {"PIDFILE": str(tmp_path / "agent.pid"), **(env or {})}
    env_table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in env.items())
    text = (
        'name = "proc"\nkind = "process"\ncommand = '
        f"{json.dumps([sys.executable, str(path), mode])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n{extra}\n[env]\n{env_table}"
    )
    return parse_definition(text, "toml")


async def kinds(runtime, run_id: str) -> list[str]:
    return [env.kind for env in await runtime.reads.log(run_id)]


async def assert_no_secret(runtime, run_id: str, store_url: str) -> None:
    text = json.dumps([env.event.to_payload() for env in await runtime.reads.log(run_id)])
    assert SECRET not in text
    if store_url.startswith("sqlite:///"):
        db = Path(store_url.removeprefix("sqlite:///"))
        for path in db.parent.glob(db.name + "*"):
            assert SECRET.encode() not in path.read_bytes()


@pytest.mark.parametrize(("store_url", "mode"), BACKEND_MODES, indirect=["store_url"])
async def test_a_real_sdk_agent_is_recorded_and_completes(
    runtime, providers, upstream_env, tmp_path, store_url, mode
):
    provider = providers(tool_loop_script(PLAN, final_text="refund settled"))
    upstream_env(provider)
    agent = process_agent(tmp_path, mode)
    run_id = await runtime.starts.start_run(agent, "settle invoice A-1")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "refund settled", "exit_code": 0}
    assert provider.call_count == 3
    assert set(provider.count_by_request_hash().values()) == {1}
    # The upstream saw the daemon's key, never the agent's placeholder.
    assert {call.api_key for call in provider.calls} == {SECRET}
    log = await kinds(runtime, run_id)
    assert log.count("ModelCallRequested") == 3 and log.count("ModelCallCompleted") == 3
    assert log[-1] == "RunCompleted"
    assert (view.input_tokens, view.output_tokens) == (
        60,
        15,
    )  # usage read from each wire's body or frames
    await assert_no_secret(runtime, run_id, store_url)


async def test_with_no_upstream_named_the_daemons_own_openai_base_url_is_the_upstream(
    runtime, providers, tmp_path, monkeypatch
):
    provider = providers(tool_loop_script(PLAN, final_text="refund settled"))
    for name in ("SALVOR_AGENT_UPSTREAM", "SALVOR_MODEL_BASE_URL", "SALVOR_AGENT_KEY"):
        monkeypatch.delenv(name, raising=False)
    # The provider is reachable through this variable alone.
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider.base_url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-for-another-host")
    agent = process_agent(tmp_path, "openai")
    run_id = await runtime.starts.start_run(agent, "settle invoice A-1")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "refund settled", "exit_code": 0}
    assert provider.call_count == 3
    # An OpenAI endpoint is sent the OpenAI key, never the Anthropic one beside it.
    assert {call.api_key for call in provider.calls} == {SECRET}


@pytest.mark.parametrize(("store_url", "mode"), BACKEND_MODES, indirect=["store_url"])
async def test_a_killed_agent_process_is_restarted_and_replays_its_recorded_calls(
    runtime, providers, upstream_env, tmp_path, store_url, mode
):
    release = threading.Event()

    def on_call(call) -> None:
        if call.index == 1:
            release.wait(20)  # the second call hangs until the agent is killed

    provider = providers(tool_loop_script(PLAN), on_call=on_call)
    upstream_env(provider)
    agent = process_agent(tmp_path, mode)
    run_id = await runtime.starts.start_run(agent, {"invoice": "A-1"})
    try:
        async with trio.open_nursery() as nursery:

            async def first_drive() -> None:
                with pytest.raises(DriveInterrupted, match="killed by signal 9"):
                    await runtime.drive(run_id, agent=agent)

            nursery.start_soon(first_drive)
            await trio.to_thread.run_sync(provider.wait_for_calls, 2, 30)
            os.kill(int((tmp_path / "agent.pid").read_text()), signal.SIGKILL)
    finally:
        release.set()
    view = await runtime.reads.view(run_id)
    assert (
        view.state.value == "awaiting_model" and view.pending is not None
    )  # the cut call's intent is open
    served_before = provider.call_count
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "done", "exit_code": 0}
    counts = sorted(provider.count_by_request_hash().values())
    # Call 1 served once (answered from the log after the kill), the cut call twice, the last once.
    assert counts == [1, 1, 2], counts
    assert provider.call_count == served_before + 2
    log = await kinds(runtime, run_id)
    assert log.count("ModelCallRequested") == 3 and log.count("ModelCallCompleted") == 3
    await assert_no_secret(runtime, run_id, store_url)


async def test_a_changed_request_at_a_recorded_position_fails_the_run_naming_it(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    model_file = tmp_path / "model.txt"
    model_file.write_text("scripted-model")
    env = {"MODELFILE": str(model_file), "DIE_AFTER": "2", "MARKER": str(tmp_path / "died")}
    agent = process_agent(tmp_path, "anthropic", env=env, extra="record_prompts = true")
    run_id = await runtime.starts.start_run(agent, "settle")
    with pytest.raises(DriveInterrupted):
        await runtime.drive(run_id, agent=agent)
    assert provider.call_count == 2
    model_file.write_text("another-model")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert "model call 1" in view.detail["error"]
    assert "'another-model' where the recording has 'scripted-model'" in view.detail["error"]
    assert provider.call_count == 2


async def test_divergence_without_recorded_prompts_names_the_model_and_roles(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    model_file = tmp_path / "model.txt"
    model_file.write_text("scripted-model")
    env = {"MODELFILE": str(model_file), "DIE_AFTER": "1", "MARKER": str(tmp_path / "died")}
    agent = process_agent(tmp_path, "openai", env=env)
    run_id = await runtime.starts.start_run(agent, "settle")
    with pytest.raises(DriveInterrupted):
        await runtime.drive(run_id, agent=agent)
    model_file.write_text("another-model")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    error = view.detail["error"]
    assert "model call 1" in error and "'another-model'" in error and "['user']" in error
    assert provider.call_count == 1


async def test_exit_nonzero_before_any_model_call_fails_with_code_and_stderr(runtime, tmp_path):
    script = "import sys\nsys.stderr.write('config missing: AGENT_HOME\\n')\nsys.exit(3)\n"
    agent = process_agent(tmp_path, script=script)
    run_id = await runtime.starts.start_run(agent, "x")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert "exited with code 3 before any model call" in view.detail["error"]
    assert "config missing: AGENT_HOME" in view.detail["error"]


async def test_exit_zero_without_model_calls_fails_with_the_diagnosis(runtime, tmp_path):
    agent = process_agent(tmp_path, script="print('hello')\n")
    run_id = await runtime.starts.start_run(agent, "x")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert (
        "OPENAI_BASE_URL" in view.detail["error"] and "ANTHROPIC_BASE_URL" in view.detail["error"]
    )


async def test_a_process_past_its_timeout_is_killed_with_its_group(runtime, tmp_path):
    script = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open(os.environ['PIDFILE'] + '.child', 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    agent = process_agent(tmp_path, script=script, extra="")
    agent = parse_definition(agent.stored_text.replace("timeout = 60", "timeout = 1"), "toml")
    run_id = await runtime.starts.start_run(agent, "x")
    with trio.fail_after(20):
        view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed" and "timeout of 1s" in view.detail["error"]
    child = int((tmp_path / "agent.pid.child").read_text())
    with trio.fail_after(30):  # a bound on a child that outlives its group's kill
        while True:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            # A zombie still answers kill(0); its state says it is gone.
            stat = Path(f"/proc/{child}/stat")
            if not stat.exists() or stat.read_text().split(") ")[1].startswith("Z"):
                break
            await trio.sleep(0.05)


async def test_the_agent_sees_its_task_and_the_injected_variables(runtime, tmp_path, monkeypatch):
    script = (
        "import json, os\n"
        "keys = ['OPENAI_BASE_URL', 'OPENAI_API_BASE', 'OPENAI_BASE', 'ANTHROPIC_BASE_URL', "
        "'SALVOR_LLM_PROXY',\n        'OPENAI_API_KEY', 'ANTHROPIC_API_KEY', 'SALVOR_PROMPT', "
        "'SALVOR_INPUT', 'SALVOR_RUN_ID', 'EXTRA',\n        'SALVOR_AGENT_KEY', 'SALVOR_STORE']\n"
        "open('seen.json', 'w').write(json.dumps({k: os.environ.get(k) for k in keys}))\n"
        "raise SystemExit(1)\n"
    )
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    monkeypatch.setenv("SALVOR_STORE", "postgresql://user:pw@db/salvor")
    agent = process_agent(tmp_path, script=script, env={"EXTRA": "x", "OPENAI_BASE": "overridden"})
    run_id = await runtime.starts.start_run(agent, {"task": "refund"})
    await runtime.drive(run_id, agent=agent)
    seen = json.loads((tmp_path / "seen.json").read_text())
    base = seen["ANTHROPIC_BASE_URL"]
    assert base.startswith("http://127.0.0.1:") and "/r/" in base
    assert (
        seen["OPENAI_BASE_URL"]
        == seen["OPENAI_API_BASE"]
        == seen["SALVOR_LLM_PROXY"]
        == base + "/v1"
    )
    assert seen["OPENAI_BASE"] == "overridden" and seen["EXTRA"] == "x"
    assert seen["OPENAI_API_KEY"] == seen["ANTHROPIC_API_KEY"] == "salvor-placeholder"
    assert (
        json.loads(seen["SALVOR_PROMPT"]) == {"task": "refund"} == json.loads(seen["SALVOR_INPUT"])
    )
    assert seen["SALVOR_RUN_ID"] == run_id
    assert seen["SALVOR_AGENT_KEY"] is None and seen["SALVOR_STORE"] is None


async def test_the_proxy_refuses_unknown_capabilities_and_non_json_bodies(
    runtime, providers, upstream_env, tmp_path
):
    async with open_model_proxy() as proxy, httpx.AsyncClient() as client:
        answer = await client.post(
            f"{proxy.url}/r/not-a-capability/v1/chat/completions", json={"model": "m"}
        )
        assert answer.status_code == 404 and "error" in answer.json()
        # A mounted session refuses a body that is not JSON, in the client's wire format.
        from salvor.daemon.proxies._model_proxy import ProxySession
        from salvor.daemon.recording._run_context import RunContext

        agent = process_agent(tmp_path, script="pass\n")
        run_id = await runtime.starts.start_run(agent, "x")
        log = await runtime.reads.log(run_id)
        session = ProxySession(
            RunContext(runtime.access, run_id, log),
            log,
            record_prompts=False,
            upstream=None,
            client=proxy.client,
        )
        cap = proxy.attach(session)
        json_type = {"Content-Type": "application/json"}
        answer = await client.post(
            f"{proxy.base(cap)}/v1/messages", content=b"not json", headers=json_type
        )
        assert answer.status_code == 400 and answer.json()["type"] == "error"
        # One not sent as JSON (as a page of another site could send it) is not read at all.
        answer = await client.post(f"{proxy.base(cap)}/v1/messages", content=b'{"model": "m"}')
        assert answer.status_code == 415
        assert answer.json()["error"]["code"] == "unsupported_media_type"
        answer = await client.get(f"{proxy.base(cap)}/v1/models")
        assert answer.status_code == 200 and answer.json()["object"] == "list"
        assert await kinds(runtime, run_id) == ["RunStarted"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('kind = "process"\n', "needs `command`"),
        ('kind = "process"\ncommand = []\n', "must name a program"),
        ('kind = "process"\ncommand = [1]\n', "array of strings"),
        ('kind = "process"\ncommand = "a \'b"\n', "cannot be split"),
        ('kind = "process"\ncommand = "a"\ntimeout = 0\n', "`timeout` must be a positive number"),
        ('kind = "process"\ncommand = "a"\n[env]\nX = 1\n', "`env` value of X must be a string"),
        ('kind = "process"\ncommand = "a"\nmodel = "m"\n', "unknown field `model`"),
        ('kind = "process"\ncommand = "a"\nrecord_prompts = "yes"\n', "true or false"),
        ('kind = "robot"\ncommand = "a"\n', "`kind` must be one of"),
    ],
)
def test_bad_process_definitions_are_refused(text, fragment):
    with pytest.raises(DefinitionError, match=None) as refused:
        parse_definition(text, "toml")
    assert fragment in str(refused.value)


def test_a_process_definition_parses_and_hashes_without_its_name():
    one = parse_definition(
        'name = "a"\nkind = "process"\ncommand = "python agent.py --fast"\n', "toml"
    )
    two = parse_definition(
        'name = "b"\nkind = "process"\ncommand = "python agent.py --fast"\n', "toml"
    )
    assert one.kind == "process" and one.process.command == ("python", "agent.py", "--fast")
    assert one.process.timeout == 300 and one.agent_def_hash == two.agent_def_hash
    listed = parse_definition(
        'kind = "process"\ncommand = ["python", "agent.py"]\ncwd = "/tmp"\n[env]\nA = "1"\n',
        "json" if False else "toml",
    )
    assert listed.process.cwd == "/tmp" and listed.process.env == {"A": "1"}


def test_salvor_run_drives_a_process_agent_through_its_own_proxy(store_url, providers, tmp_path):
    from tests.daemon.cli.test_cli import salvor_process as salvor

    provider = providers(tool_loop_script(PLAN, final_text="settled"))
    agent = process_agent(tmp_path, "anthropic-stream")
    (tmp_path / "agent.toml").write_text(agent.stored_text)
    env = {"SALVOR_AGENT_UPSTREAM": provider.base_url, "SALVOR_AGENT_KEY": SECRET}
    result = salvor(
        store_url, "run", str(tmp_path / "agent.toml"), "--input", '"settle A-1"', env=env
    )
    assert result.returncode == 0, result.stderr
    assert provider.call_count == 3
    assert SECRET not in result.stdout + result.stderr
    result = salvor(
        store_url, "run", str(tmp_path / "agent.toml"), "--json", "--input", '"settle"', env=env
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("mode", ["openai", "openai-responses-stream", "anthropic-stream"])
async def test_an_upstream_error_reaches_the_agent_and_its_retry_reissues_the_open_intent(
    runtime, providers, upstream_env, tmp_path, mode
):
    loop = tool_loop_script(PLAN)

    def script(call):
        return ErrorReply(500, "upstream overloaded") if call.index == 1 else loop(call)

    provider = providers(script)
    upstream_env(provider)
    agent = process_agent(tmp_path, mode, env={"RETRIES": "2"})
    run_id = await runtime.starts.start_run(agent, "settle")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert provider.call_count == 4
    log = await kinds(runtime, run_id)
    # The failed attempt recorded nothing: one intent per call, re-issued in place.
    assert log.count("ModelCallRequested") == 3 and log.count("ModelCallCompleted") == 3


@pytest.mark.parametrize("mode", ["openai-responses", "openai-responses-stream"])
async def test_a_failed_response_is_not_recorded_and_its_retry_reissues_the_open_intent(
    runtime, providers, upstream_env, tmp_path, mode
):
    loop = tool_loop_script(PLAN)

    def script(call):
        return FailedResponse("the model crashed") if call.index == 1 else loop(call)

    provider = providers(script)
    upstream_env(provider)
    agent = process_agent(tmp_path, mode, env={"RETRIES": "1"})
    run_id = await runtime.starts.start_run(agent, "settle")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    # The failed answer reached the agent (on HTTP 200) but was not recorded: its retry
    # was the same call at the same position, issued again upstream.
    assert provider.call_count == 4
    assert sorted(provider.count_by_request_hash().values()) == [1, 1, 2]
    log = await kinds(runtime, run_id)
    assert log.count("ModelCallRequested") == 3 and log.count("ModelCallCompleted") == 3


async def test_an_upstream_refusal_fails_the_run_with_the_agents_own_error(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(lambda call: ErrorReply(400, "model scripted-model does not exist"))
    upstream_env(provider)
    agent = process_agent(tmp_path, "anthropic")
    run_id = await runtime.starts.start_run(agent, "settle")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert "exited with code 1" in view.detail["error"]
    assert "does not exist" in view.detail["error"]
    log = await kinds(runtime, run_id)
    assert log == ["RunStarted", "ModelCallRequested", "RunFailed"]


async def test_a_recovered_process_that_exits_before_replaying_every_recorded_call_fails(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    exit_file = tmp_path / "exit-after"
    env = {"DIE_AFTER": "2", "MARKER": str(tmp_path / "died"), "EXITFILE": str(exit_file)}
    agent = process_agent(tmp_path, "openai", env=env)
    run_id = await runtime.starts.start_run(agent, "settle")
    with pytest.raises(DriveInterrupted):
        await runtime.drive(run_id, agent=agent)
    exit_file.write_text("1")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert "after 1 of the 2 recorded model calls" in view.detail["error"]
    assert provider.call_count == 2


@pytest.mark.parametrize("where", ["command", "cwd"])
async def test_an_agent_that_cannot_be_started_fails_naming_why(runtime, tmp_path, where):
    if where == "command":
        text = 'kind = "process"\ncommand = "/nonexistent/agent --go"\n'
    else:
        text = (
            f'kind = "process"\ncommand = "true"\ncwd = {json.dumps(str(tmp_path / "missing"))}\n'
        )
    agent = parse_definition(text, "toml")
    run_id = await runtime.starts.start_run(agent, "x")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert "could not be started" in view.detail["error"]
