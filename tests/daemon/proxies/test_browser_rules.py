"""The agents' ports hold requests to the browser rules too (issue 29): the model proxy (and the MCP
stand-ins on it), a service agent's ``proxy_port`` and an MCP server's fixed ``port``. A request
whose ``Host`` is not a loopback name, one that carries an ``Origin`` (a page: agents' SDKs send
none), or a POST whose body does not say ``Content-Type: application/json`` is refused in the one
error envelope before the port reads it, and the run's log is unchanged. What an agent's SDK sends
(Host 127.0.0.1:PORT, no Origin, JSON) still goes through: the process and service agent tests
drive real SDKs through these same ports.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import httpx
import pytest
import trio
from salvor.daemon.agents._service import _RootMount, _serve_port
from salvor.daemon.proxies import ProxySession, open_model_proxy
from salvor.daemon.proxies._mcp_endpoint import serve_fixed_port
from salvor.daemon.recording._run_context import RunContext

from tests.daemon.agents.test_process_agent import kinds, process_agent

JSON_TYPE = {"Content-Type": "application/json"}


def refusals(port: int) -> list[tuple[str, dict, int, str]]:
    """(what, headers, status, code) of every request a port of ``port`` must refuse."""
    return [
        ("a rebound name", {**JSON_TYPE, "Host": f"rebound.test:{port}"}, 403, "forbidden"),
        ("another name", {**JSON_TYPE, "Host": "attacker.example"}, 403, "forbidden"),
        ("a page elsewhere", {**JSON_TYPE, "Origin": "http://127.0.0.1:1"}, 403, "forbidden"),
        ("no type", {}, 415, "unsupported_media_type"),
        ("text/plain", {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        (
            "a form",
            {"Content-Type": "application/x-www-form-urlencoded"},
            415,
            "unsupported_media_type",
        ),
    ]


async def assert_refused(client: httpx.AsyncClient, url: str, port: int, body: bytes) -> None:
    for what, headers, status, code in refusals(port):
        response = await client.post(url, content=body, headers=headers)
        assert response.status_code == status, (what, response.text)
        assert response.json()["error"]["code"] == code, (what, response.text)


@pytest.fixture
async def mounted(runtime, upstream_env, tmp_path):
    """The model proxy with one process run's session mounted: (proxy, its base URL, run id)."""
    agent = process_agent(tmp_path, script="pass\n")
    run_id = await runtime.starts.start_run(agent, "x")
    log = await runtime.reads.log(run_id)
    async with open_model_proxy() as proxy:
        session = ProxySession(
            RunContext(runtime.access, run_id, log),
            log,
            record_prompts=False,
            upstream=None,
            client=proxy.client,
        )
        session.mcp_lanes = {"fs": object()}  # refused before the lane is ever asked
        yield proxy, proxy.base(proxy.attach(session)), run_id


async def test_the_model_proxy_and_its_mcp_standins_refuse_pages(runtime, mounted) -> None:
    proxy, base, run_id = mounted
    port = int(proxy.url.rsplit(":", 1)[1])
    body = b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}'
    async with httpx.AsyncClient() as client:
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/mcp/fs"):
            await assert_refused(client, base + path, port, body)
        # A GET has no body to check, but its Host and Origin are.
        answer = await client.get(base + "/v1/models", headers={"Host": "rebound.test"})
        assert (answer.status_code, answer.json()["error"]["code"]) == (403, "forbidden")
        answer = await client.get(base + "/mcp/fs", headers={"Origin": "http://127.0.0.1:1"})
        assert (answer.status_code, answer.json()["error"]["code"]) == (403, "forbidden")
        # What an SDK sends is answered by the proxy itself (the model list, locally).
        answer = await client.get(base + "/v1/models")
        assert answer.status_code == 200 and answer.json()["object"] == "list"
    assert await kinds(runtime, run_id) == ["RunStarted"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_an_mcp_servers_fixed_port_refuses_pages_with_its_lane_untouched() -> None:
    port = _free_port()
    # The refusals come before the lane is asked anything: a lane with nothing but a name.
    lane = SimpleNamespace(name="fs")
    url = f"http://127.0.0.1:{port}/mcp"
    message = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_fixed_port, lane, port)
        async with httpx.AsyncClient() as client:
            await assert_refused(client, url, port, message)
            # The port answers a well-formed request from an agent itself (here: not at /mcp).
            answer = await client.post(
                f"http://127.0.0.1:{port}/elsewhere", content=message, headers=JSON_TYPE
            )
            assert answer.status_code == 404 and answer.json()["error"]["code"] == -32600
        nursery.cancel_scope.cancel(reason="the test is done with the port")


async def test_a_service_agents_proxy_port_refuses_pages(runtime, mounted) -> None:
    proxy, base, run_id = mounted
    capability = base.rsplit("/", 1)[1]
    port = _free_port()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(16)
    sock.setblocking(False)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(_serve_port, _RootMount(proxy, capability), sock, stop)
        async with httpx.AsyncClient() as client:
            root = f"http://127.0.0.1:{port}"
            body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
            for path in ("/v1/chat/completions", "/v1/messages"):
                await assert_refused(client, root + path, port, body)
            answer = await client.get(root + "/v1/models")
            assert answer.status_code == 200 and answer.json()["object"] == "list"
        stop.set()
    assert await kinds(runtime, run_id) == ["RunStarted"]
