"""Fixtures for the server suites: the real daemon, in-process, on a loopback port.

``server`` is ``salvor.daemon.serve._serve.serve`` itself (the production code path:
hypercorn, the routes, the drivers, the store's writer thread) started in the
test's trio loop on ``127.0.0.1:0`` over the test's store (SQLite, and
PostgreSQL when ``SALVOR_TEST_POSTGRES_URL`` is set), and stopped at the end
through the same graceful stop a SIGTERM begins. Tests talk to it over real
HTTP with ``server.client`` (an ``httpx.AsyncClient``).

``server_factory`` starts more: with an auth token, a registry of its own, or
a second daemon over the same store (a restart). ``providers`` starts
scripted model providers, and ``agent_toml`` writes an agent aimed at one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trio
from salvor.daemon.agents._credentials import Credentials, DeclaredEndpoint, McpOrigin, origin_of
from salvor.daemon.api._app import ServerState
from salvor.daemon.serve._serve import ServeConfig, serve
from salvor.daemon.tools._registry import ToolRegistry

from tests.support.scripted_provider import ScriptedProvider

# States a run rests at: nothing more happens until someone acts (or a timer).
RESTING = frozenset(
    {
        "completed",
        "failed",
        "abandoned",
        "suspended",
        "sleeping",
        "budget_exceeded",
        "needs_reconciliation",
    }
)
TOKEN = "s3cret-test-token"


def agent_toml(
    base_url: str, *, tools=(), name: str | None = None, wire: str = "anthropic", extra: str = ""
) -> str:
    """An agent definition aimed at a scripted provider, with demo tools by name."""
    head = f'name = "{name}"\n' if name is not None else ""
    tool_tables = "".join(f'\n[[tools]]\nname = "{tool}"\n' for tool in tools)
    return (
        f'{head}model = "scripted-model"\nsystem_prompt = "You settle refunds."\n{extra}\n'
        f'[llm]\nprovider = "{wire}"\nbase_url = "{base_url}"\nmax_retries = 0\n'
        f"{tool_tables}"
    )


@dataclass
class Server:
    """One running daemon: its URL, its shared state, and a client for it."""

    url: str
    state: ServerState
    client: httpx.AsyncClient
    store_url: str
    auth_token: str | None
    _stop: trio.Event
    _stopped: trio.Event
    _clients: list[httpx.AsyncClient] = field(default_factory=list)

    def new_client(self, **kwargs: Any) -> httpx.AsyncClient:
        """Another client for this server (closed when the server stops);
        no auth header unless given."""
        client = httpx.AsyncClient(base_url=self.url, timeout=30, **kwargs)
        self._clients.append(client)
        return client

    async def register_agent(
        self, definition: str, *, content_type: str = "application/toml"
    ) -> str:
        response = await self.client.post(
            "/v1/agents", content=definition, headers={"Content-Type": content_type}
        )
        assert response.status_code == 201, response.text
        return response.json()["agent"]

    async def start_run(self, agent: str, run_input: Any = None, **fields: Any) -> str:
        response = await self.client.post(
            "/v1/runs", json={"agent": agent, "input": run_input, **fields}
        )
        assert response.status_code == 201, response.text
        return response.json()["run"]

    async def wait_resting(self, run_id: str, *, timeout: float = 30) -> dict:
        """Poll ``GET /v1/runs/{id}`` until the run rests and no driver
        holds it; returns that body."""
        with trio.fail_after(timeout):
            while True:
                response = await self.client.get(f"/v1/runs/{run_id}")
                assert response.status_code == 200, response.text
                body = response.json()
                if body["status"]["state"] in RESTING and body.get("driver") != "attached":
                    return body
                await trio.sleep(0.01)

    async def stop(self) -> None:
        """The graceful stop (what SIGTERM does); returns once ``serve`` has returned."""
        for client in self._clients:
            await client.aclose()
        self._stop.set()
        with trio.fail_after(30):
            await self._stopped.wait()


ServerFactory = Callable[..., Awaitable[Server]]


@dataclass
class Declarations:
    """The test is the operator: every scripted provider it starts is a model
    endpoint its daemons declared."""

    endpoints: list[str] = field(default_factory=list)
    origins: list[McpOrigin] = field(default_factory=list)
    service_origins: list[McpOrigin] = field(default_factory=list)
    daemons: list[Credentials] = field(default_factory=list)

    def provider(self, base_url: str) -> None:
        self.endpoints.append(base_url)
        for credentials in self.daemons:
            credentials.declare_endpoint(DeclaredEndpoint(base_url=base_url))

    def mcp_origin(self, url: str, *header_envs: str) -> None:
        """What ``--mcp-origin`` declares, for every daemon of the test."""
        origin = McpOrigin(origin=origin_of(url), header_envs=frozenset(header_envs))
        self.origins.append(origin)
        for credentials in self.daemons:
            credentials.declare_origin(origin)

    def service_origin(self, url: str, *header_envs: str) -> None:
        """What ``--service-origin`` declares, for every daemon of the test."""
        origin = McpOrigin(origin=origin_of(url), header_envs=frozenset(header_envs))
        self.service_origins.append(origin)
        for credentials in self.daemons:
            credentials.declare_origin(origin, dialled_by="service")

    def daemon(self, credentials: Credentials) -> Credentials:
        for base_url in self.endpoints:
            credentials.declare_endpoint(DeclaredEndpoint(base_url=base_url))
        for origin in self.origins:
            credentials.declare_origin(origin)
        for origin in self.service_origins:
            credentials.declare_origin(origin, dialled_by="service")
        self.daemons.append(credentials)
        return credentials


@pytest.fixture
def operator_declarations() -> Declarations:
    return Declarations()


@pytest.fixture
async def server_factory(store_url: str, operator_declarations: Declarations) -> ServerFactory:
    """Start daemons over the test's store; every one is stopped gracefully afterwards.

    ``await server_factory(auth_token=..., registry=..., **ServeConfig fields)``. Each
    daemon declares the test's scripted providers as model endpoints (``Declarations``).
    """
    started: list[Server] = []
    async with trio.open_nursery() as nursery:

        async def start(
            *, auth_token: str | None = None, registry: ToolRegistry | None = None, **overrides: Any
        ) -> Server:
            settings = {
                "wake_interval": 0,
                "demo_tools": True,
                "shutdown_seconds": 5.0,
                **overrides,
            }
            settings["credentials"] = operator_declarations.daemon(
                settings.get("credentials") or Credentials.for_daemon()
            )
            config = ServeConfig(
                host="127.0.0.1", port=0, store_url=store_url, auth_token=auth_token, **settings
            )
            stop, stopped = trio.Event(), trio.Event()
            states: list[ServerState] = []

            async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await serve(
                        config,
                        registry=registry,
                        stop=stop,
                        on_state=states.append,
                        task_status=task_status,
                    )
                finally:
                    stopped.set()

            binds = await nursery.start(run)
            url = next(b for b in binds if b.startswith("http://"))
            server = Server(
                url=url,
                state=states[0],
                client=None,
                store_url=store_url,  # type: ignore[arg-type]
                auth_token=auth_token,
                _stop=stop,
                _stopped=stopped,
            )
            headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
            server.client = server.new_client(headers=headers)
            started.append(server)
            return server

        try:
            yield start
        finally:
            for server in started:
                if not server._stopped.is_set():
                    await server.stop()


@pytest.fixture
async def server(server_factory: ServerFactory) -> Server:
    """The daemon with no auth token, demo tools, and the wake sweeper off."""
    return await server_factory()


@pytest.fixture
def providers(operator_declarations: Declarations) -> Iterator[Callable[..., ScriptedProvider]]:
    """Start scripted providers (``providers(script, **kwargs)``); all stopped afterwards."""
    started: list[ScriptedProvider] = []

    def start(script, **kwargs) -> ScriptedProvider:
        provider = ScriptedProvider(script, **kwargs)
        started.append(provider)
        operator_declarations.provider(provider.base_url)
        return provider

    yield start
    for provider in started:
        provider.stop()
