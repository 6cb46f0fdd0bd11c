"""Service agents: a running service triggered by a POST, its model calls recorded on its own port.

The service is a real program (``service_support.SERVICE``) whose model client
is the real openai or anthropic SDK, started with its base URL at the
agent's ``proxy_port`` as its wiring contract asks; the scripted provider is
the upstream. The verdict of every run comes from the trajectory the proxy
recorded, never from the trigger's HTTP status.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import trio
import trio.testing
from salvor.daemon.agents._definition import DefinitionError, parse_definition
from salvor.daemon.processes._port_claims import PortClaims
from salvor.daemon.web._errors import OperationRefused
from salvor.protocol import EventKind, RunAbandoned

from tests.daemon.agents.test_process_agent import PLAN, SECRET, kinds
from tests.support.backends import SQLITE_ONLY
from tests.support.scripted_provider import tool_loop_script
from tests.support.service_agents import free_port, service_definition, start_service

# SQLite alone (tests/support/backends.py): what it tests is service agents' triggers and replies.
STORE_BACKENDS = SQLITE_ONLY

HEADER_SECRET = "svc-token-SECRET-91be"


@pytest.fixture
def upstream_env(monkeypatch):
    def aim(provider) -> None:
        monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
        monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)

    return aim


@pytest.fixture
def services():
    """Start services (``services(tmp_path, mode, base_url, env=...)``); all stopped afterwards."""
    started = []

    def start(*args, **kwargs):
        service = start_service(*args, **kwargs)
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


def proxy_base(mode: str, port: int) -> str:
    return f"http://127.0.0.1:{port}/v1" if mode == "openai" else f"http://127.0.0.1:{port}"


def service_agent(url: str, port: int, **kwargs):
    return parse_definition(service_definition(url, port, **kwargs), "toml")


async def wait_for(predicate, what: str, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def store_bytes(store_url: str) -> bytes:
    if not store_url.startswith("sqlite:///"):
        return b""
    db = Path(store_url.removeprefix("sqlite:///"))
    return b"".join(path.read_bytes() for path in db.parent.glob(db.name + "*"))


@pytest.mark.parametrize("mode", ["openai", "anthropic"])
async def test_a_service_run_completes_with_the_reply(
    runtime, providers, upstream_env, services, tmp_path, mode
):
    provider = providers(tool_loop_script(PLAN, final_text="refund settled"))
    upstream_env(provider)
    port = free_port()
    service = services(tmp_path, mode, proxy_base(mode, port))
    agent = service_agent(service.url, port)
    run_id = await runtime.starts.start_run(agent, {"invoice": "A-1"})
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "refund settled", "trigger_status": 200}
    # Each call was served once, with the daemon's key, never the service's own.
    assert provider.call_count == 3
    assert set(provider.count_by_request_hash().values()) == {1}
    assert {call.api_key for call in provider.calls} == {SECRET}
    (trigger,) = service.entries("trigger")
    assert trigger["path"] == "/task" and trigger["prompt"] == json.dumps({"invoice": "A-1"})
    log = await kinds(runtime, run_id)
    assert log.count("ModelCallRequested") == 3 and log.count("ModelCallCompleted") == 3
    assert runtime.kit.ports.holder(port) is None  # the drive let the port go


async def test_a_mispointed_service_fails_with_the_port_to_point_at(
    runtime, providers, upstream_env, services, tmp_path
):
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    port = free_port()
    # Its base URL goes straight to the provider: the run sees no model call.
    service = services(tmp_path, "openai", f"{provider.base_url}/v1")
    agent = service_agent(service.url, port)
    run_id = await runtime.starts.start_run(agent, "settle A-1")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    error = view.detail["error"]
    assert "without making any model call" in error and "HTTP 200" in error
    assert f"OPENAI_BASE_URL=http://127.0.0.1:{port}/v1" in error
    assert f"ANTHROPIC_BASE_URL=http://127.0.0.1:{port}" in error


async def test_header_variables_reach_the_service_and_never_the_store(
    runtime, providers, upstream_env, services, tmp_path, store_url, monkeypatch, caplog
):
    caplog.set_level("DEBUG")
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    monkeypatch.setenv("SERVICE_TOKEN", HEADER_SECRET)
    port = free_port()
    service = services(tmp_path, "anthropic", proxy_base("anthropic", port))
    agent = service_agent(
        service.url, port, headers={"Authorization": "Bearer ${SERVICE_TOKEN}", "X-Desk": "refunds"}
    )
    assert "${SERVICE_TOKEN}" in agent.stored_text and HEADER_SECRET not in agent.stored_text
    run_id = await runtime.starts.start_run(agent, "settle A-1")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    (trigger,) = service.entries("trigger")
    assert trigger["headers"]["authorization"] == f"Bearer {HEADER_SECRET}"
    assert trigger["headers"]["x-desk"] == "refunds"
    assert HEADER_SECRET.encode() not in store_bytes(store_url)
    stored = await runtime.access.read(
        runtime.access.store.definitions.get_agent, agent.agent_def_hash
    )
    assert "${SERVICE_TOKEN}" in stored.definition
    assert HEADER_SECRET not in caplog.text


async def test_a_missing_header_variable_fails_the_run_and_sends_nothing(
    runtime, services, tmp_path, monkeypatch
):
    monkeypatch.delenv("SERVICE_TOKEN", raising=False)
    port = free_port()
    service = services(tmp_path, "openai", proxy_base("openai", port))
    agent = service_agent(service.url, port, headers={"Authorization": "Bearer ${SERVICE_TOKEN}"})
    run_id = await runtime.starts.start_run(agent, "settle")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert "${SERVICE_TOKEN}" in view.detail["error"] and "not set" in view.detail["error"]
    assert service.entries() == []


async def test_a_header_variable_with_a_line_break_fails_the_run_without_its_value(
    runtime, services, tmp_path, monkeypatch
):
    monkeypatch.setenv("SERVICE_TOKEN", f"{HEADER_SECRET}\r\nX-Injected: 1")
    port = free_port()
    service = services(tmp_path, "openai", proxy_base("openai", port))
    agent = service_agent(service.url, port, headers={"Authorization": "Bearer ${SERVICE_TOKEN}"})
    run_id = await runtime.starts.start_run(agent, "settle")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert "${SERVICE_TOKEN}" in view.detail["error"] and "line break" in view.detail["error"]
    assert HEADER_SECRET not in view.detail["error"]
    assert service.entries() == []


async def test_an_unreachable_trigger_fails_naming_the_url(runtime):
    url = f"http://127.0.0.1:{free_port()}/task"
    agent = service_agent(url, free_port())
    run_id = await runtime.starts.start_run(agent, "settle")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert f"the service at {url} could not be reached" in view.detail["error"]


async def test_a_port_another_program_holds_fails_the_run_naming_it(runtime, services, tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        service = services(tmp_path, "openai", proxy_base("openai", port))
        agent = service_agent(service.url, port)
        run_id = await runtime.starts.start_run(agent, "settle")
        view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert (
        f"proxy port {port}" in view.detail["error"]
        and "another program holds it" in view.detail["error"]
    )
    assert service.entries() == []


async def test_a_service_past_its_timeout_fails_the_run(
    runtime, providers, upstream_env, services, tmp_path
):
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    port = free_port()
    release = tmp_path / "release"
    service = services(
        tmp_path, "openai", proxy_base("openai", port), env={"RELEASE": str(release)}
    )
    agent = parse_definition(
        service_definition(service.url, port).replace("timeout = 60", "timeout = 0.5"), "toml"
    )
    run_id = await runtime.starts.start_run(agent, "settle")
    try:
        view = await runtime.drive(run_id, agent=agent)
    finally:
        release.write_text("go")
    assert view.state.value == "failed"
    assert "did not answer its trigger within its timeout of 0.5s" in view.detail["error"]


async def test_a_service_run_ended_by_another_writer_ends_its_drive_though_the_service_never_calls(
    runtime, providers, upstream_env, services, tmp_path
):
    """Another writer of the store (``salvor abandon`` beside the daemon) ends the run while the
    service is paused between its model calls: the drive reads the end within seconds and
    returns the run as that writer left it. Before, the drive waited on the trigger until the
    service's next call met the end, and then settled the run from its stale view."""
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    port = free_port()
    release = tmp_path / "release"
    service = services(
        tmp_path, "openai", proxy_base("openai", port), env={"RELEASE": str(release)}
    )
    agent = service_agent(service.url, port)
    run_id = await runtime.starts.start_run(agent, "settle")
    access = runtime.access
    try:
        async with trio.open_nursery() as nursery:
            ended = []

            async def drive() -> None:
                ended.append(await runtime.drive(run_id, agent=agent))

            nursery.start_soon(drive)
            await wait_for(lambda: service.entries("held"), "the service to pause")
            with trio.fail_after(20):
                while (view := await access.read(access.store.read_view, run_id)).pending:
                    await trio.sleep(0.02)
            await access.append(run_id, [RunAbandoned(reason="from the shell")], view)
            # The service holds its request up to 30 s; the drive must not wait for it.
            await wait_for(lambda: ended, "the drive to end", timeout=15)
    finally:
        release.write_text("go")
    assert ended[0].state.value == "abandoned", ended[0]
    log = await access.read(access.store.read_log, run_id)
    assert log[-1].event.KIND is EventKind.RUN_ABANDONED


async def drive_until_held(runtime, agent, run_id: str, service) -> None:
    """Drive until the service pauses after its first call (recorded), then cancel that drive."""
    async with trio.open_nursery() as nursery:

        async def first() -> None:
            await runtime.drive(run_id, agent=agent)

        nursery.start_soon(first)
        await wait_for(lambda: service.entries("held"), "the service to pause")
        while (await kinds(runtime, run_id)).count("ModelCallCompleted") < 1:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel(reason="the test cuts the drive")


async def test_a_cut_drive_is_triggered_again_and_replays_the_recorded_prefix(
    runtime, providers, upstream_env, services, tmp_path
):
    provider = providers(tool_loop_script(PLAN, final_text="settled"))
    upstream_env(provider)
    port = free_port()
    release = tmp_path / "release"
    service = services(
        tmp_path, "anthropic", proxy_base("anthropic", port), env={"RELEASE": str(release)}
    )
    agent = service_agent(service.url, port)
    run_id = await runtime.starts.start_run(agent, "settle A-1")
    await drive_until_held(runtime, agent, run_id, service)
    assert runtime.kit.ports.holder(port) is None
    release.write_text("go")
    # The cut request goes on and finds nothing on the port: its client raises, it answers 500.
    await wait_for(lambda: service.entries("finished"), "the cut request to end")
    assert service.entries("finished")[0]["status"] == 500
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "settled", "trigger_status": 200}
    # Call 1 was answered from the log: every distinct request was served once.
    assert sorted(provider.count_by_request_hash().values()) == [1, 1, 1]
    assert len(service.entries("trigger")) == 2


async def test_a_service_that_answers_500_after_a_divergence_fails_by_its_trajectory(
    runtime, providers, upstream_env, services, tmp_path
):
    provider = providers(tool_loop_script(PLAN))
    upstream_env(provider)
    port = free_port()
    release, model_file = tmp_path / "release", tmp_path / "model.txt"
    model_file.write_text("scripted-model")
    service = services(
        tmp_path,
        "openai",
        proxy_base("openai", port),
        env={"RELEASE": str(release), "MODELFILE": str(model_file)},
    )
    agent = service_agent(service.url, port, extra="record_prompts = true")
    run_id = await runtime.starts.start_run(agent, "settle A-1")
    await drive_until_held(runtime, agent, run_id, service)
    release.write_text("go")
    await wait_for(lambda: service.entries("finished"), "the cut request to end")
    model_file.write_text("another-model")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed"
    assert "model call 1" in view.detail["error"]
    assert "'another-model' where the recording has 'scripted-model'" in view.detail["error"]
    await wait_for(lambda: len(service.entries("finished")) == 2, "the second request to end")
    assert (
        service.entries("finished")[1]["status"] == 500
    )  # the service swallowed the proxy's refusal
    assert provider.call_count == 1


async def test_a_rerun_of_a_service_run_is_answered_from_its_origin(
    runtime, providers, upstream_env, services, tmp_path
):
    provider = providers(tool_loop_script(PLAN, final_text="refund settled"))
    upstream_env(provider)
    port = free_port()
    service = services(tmp_path, "openai", proxy_base("openai", port))
    agent = service_agent(service.url, port)
    origin = await runtime.starts.start_run(agent, "settle A-1")
    assert (await runtime.drive(origin, agent=agent)).state.value == "completed"
    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "refund settled", "trigger_status": 200}
    assert provider.call_count == 3  # the re-run sent nothing upstream
    assert [t["prompt"] for t in service.entries("trigger")] == ["settle A-1", "settle A-1"]


async def test_a_second_run_on_a_held_port_is_refused_before_anything_is_recorded(
    runtime, tmp_path
):
    port = free_port()
    agent = service_agent("http://127.0.0.1:9/task", port)
    first = await runtime.starts.start_run(agent, "one")
    with pytest.raises(OperationRefused) as refused:
        await runtime.starts.start_run(agent, "two")
    assert refused.value.code == "port_held" and refused.value.status == 409
    assert refused.value.details == {"port": port, "run": first}
    runs, _ = await runtime.access.read(runtime.access.store.list_runs)
    assert [r.run_id for r in runs] == [first]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('kind = "service"\nproxy_port = 4646\n', "needs `url`"),
        ('kind = "service"\nurl = "http://127.0.0.1:8088/task"\n', "needs `proxy_port`"),
        ('kind = "service"\nurl = "ftp://host/task"\nproxy_port = 4646\n', "`url` must be an http"),
        ('kind = "service"\nurl = "not a url"\nproxy_port = 4646\n', "`url` must be an http"),
        (
            'kind = "service"\nurl = "http://host:99999/task"\nproxy_port = 4646\n',
            "`url` must be an http",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 80\n',
            "`proxy_port` must be an integer from 1024",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 70000\n',
            "`proxy_port` must be an integer from 1024",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = "4646"\n',
            "`proxy_port` must be an integer",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = true\n',
            "`proxy_port` must be an integer",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 4646\ncommand = "x"\n',
            "unknown field `command`",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 4646\n[headers]\nX-N = 3\n',
            "`headers` value of X-N",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 4646\nheaders = "x"\n',
            "`headers` must be a table",
        ),
        (
            (
                'kind = "service"\nurl = "http://h/t"\nproxy_port = 4646\n'
                '[headers]\nA = "Bearer ${TOKEN"\n'
            ),
            "well-formed",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 4646\n[headers]\nA = "${}"\n',
            "`headers` value of A",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 4646\n[headers]\nA = "${1X}"\n',
            "well-formed",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 4646\n[headers]\n"A B" = "x"\n',
            "not an HTTP header name",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 4646\ntimeout = 0\n',
            "`timeout` must be a positive",
        ),
        (
            'kind = "service"\nurl = "http://h/t"\nproxy_port = 4646\nrecord_prompts = 1\n',
            "`record_prompts`",
        ),
    ],
)
def test_bad_service_definitions_are_refused(text, fragment):
    with pytest.raises(DefinitionError) as refused:
        parse_definition(text, "toml")
    assert fragment in str(refused.value)


def test_a_service_definition_parses_keeping_its_placeholders():
    text = service_definition(
        "https://localhost:8443/task", 4646, headers={"Authorization": "Bearer ${DEV_TOKEN}"}
    )
    agent = parse_definition(text, "toml")
    assert agent.kind == "service"
    assert (agent.service.url, agent.service.proxy_port, agent.service.timeout) == (
        "https://localhost:8443/task",
        4646,
        60.0,
    )
    assert agent.service.headers == {"Authorization": "Bearer ${DEV_TOKEN}"}
    assert (
        parse_definition(text.replace('name = "svc"', 'name = "other"'), "toml").agent_def_hash
        == agent.agent_def_hash
    )
    with pytest.raises(DefinitionError, match="--allow-process-agents"):
        parse_definition(text, "toml", allow_processes=False)


async def test_a_drive_whose_port_another_run_holds_waits_its_turn():
    claims = PortClaims()
    assert claims.claim(4646, "run-a") is None
    assert claims.claim(4646, "run-b") == "run-a"
    claims.release(4646, "run-b")  # not the holder: nothing changes
    assert claims.holder(4646) == "run-a"
    entered = trio.Event()

    async def second() -> None:
        async with claims.hold(4646, "run-b"):
            assert claims.holder(4646) == "run-b"
            entered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert not entered.is_set()
        claims.release(4646, "run-a")
    assert entered.is_set()
    assert claims.holder(4646) is None
