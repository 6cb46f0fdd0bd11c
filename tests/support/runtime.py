"""Fixtures for the daemon suites: a runtime over a real store, agents aimed at
the scripted provider, a settable clock for timers, the fixture MCP server."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.recording._store_access import open_store_access
from salvor.daemon.runs._runtime import Runtime
from salvor.daemon.tools._demo import demo_registry

from tests.support.mcp_servers import FixtureServer
from tests.support.scripted_provider import ScriptedProvider


class Clock:
    """A clock the test moves by hand; every drive reads (and records) it."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fx(tmp_path: Path) -> FixtureServer:
    """The fixture MCP server's evidence directory (``tests.support.mcp_servers``)."""
    directory = tmp_path / "fx"
    directory.mkdir()
    return FixtureServer(directory)


@pytest.fixture
def effects_path(tmp_path: Path) -> Path:
    return tmp_path / "effects.jsonl"


def ledger(path: Path) -> list[dict]:
    """The demo tools' side-effect ledger: one record per real execution."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def registry(effects_path: Path):
    return demo_registry(str(effects_path))


def with_registry(runtime: Runtime, registry) -> Runtime:
    """A runtime over ``runtime``'s store and clock whose drives use ``registry`` instead (what a
    drive is handed is frozen: ``DriveKit``)."""
    return Runtime(runtime.access, registry, clock=runtime.kit.clock)


@pytest.fixture
async def runtime(store_url: str, registry, clock: Clock):
    async with open_store_access(store_url) as access:
        yield Runtime(access, registry, clock=clock)


@pytest.fixture
def providers():
    started: list[ScriptedProvider] = []

    def start(script, **kwargs) -> ScriptedProvider:
        provider = ScriptedProvider(script, **kwargs)
        started.append(provider)
        return provider

    yield start
    for provider in started:
        provider.stop()


def agent_toml(
    base_url: str, *, tools=(), wire: str = "anthropic", extra: str = "", llm_extra: str = ""
) -> str:
    tool_tables = "".join(f'\n[[tools]]\nname = "{name}"\n' for name in tools)
    return (
        f'model = "scripted-model"\nsystem_prompt = "You settle refunds."\n{extra}\n'
        f'[llm]\nprovider = "{wire}"\nbase_url = "{base_url}"\nmax_retries = 0\n{llm_extra}\n'
        f"{tool_tables}"
    )


@pytest.fixture
def make_agent(registry):
    def make(provider: ScriptedProvider, *, tools=(), wire="anthropic", extra="", llm_extra=""):
        text = agent_toml(
            provider.base_url, tools=tools, wire=wire, extra=extra, llm_extra=llm_extra
        )
        return parse_definition(text, "toml", known_tools=registry.names())

    return make


@pytest.fixture
def upstream_env(monkeypatch):
    """Aim process agents' live model calls at a scripted provider, with the upstream key."""
    from tests.daemon.agents.test_process_agent import SECRET

    def aim(provider) -> None:
        monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
        monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)

    return aim
