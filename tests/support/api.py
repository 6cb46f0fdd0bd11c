"""Helpers shared by the API suites: the envelope check, store snapshots and
reads that bypass the daemon, and short ways to register agents and start runs."""

from __future__ import annotations

import functools
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy
import trio
from salvor.protocol import EMPTY_VIEW, RunStarted
from salvor.store import EventStore, normalize_store_url

from tests.support.api_server import Server, agent_toml
from tests.support.scripted_provider import tool_loop_script
from tests.support.spawn import run_salvor

REFUND_DESK = Path(__file__).resolve().parents[2] / "contrib" / "agents" / "refund-desk.toml"

NOBODY = "00000000-0000-4000-8000-000000000000"
FAR_WAKE = "2099-01-01T00:00:00Z"
APPROVAL_SCHEMA = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
}


# -- helpers ---------------------------------------------------------------------


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    """The one envelope, nothing else, and never a traceback; returns ``error``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert "Traceback" not in response.text and 'File "' not in response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"].strip()
    assert set(error) <= {"code", "message", "details"}
    return error


async def snapshot(server: Server) -> tuple:
    """What the store holds: every run's entry and every registered agent."""
    store = server.state.runtime.access.store
    runs, _ = await server.state.runtime.access.read(store.list_runs)
    agents = await server.state.runtime.access.read(store.definitions.list_agents)
    return sorted((r.run_id, r.event_count, r.last_recorded_at) for r in runs), [
        a.agent_def_hash for a in agents
    ]


async def read_log_independently(store_url: str, run_id: str) -> list:
    """The run's log through a store handle of its own (another connection, not the daemon's)."""

    def read() -> list:
        with EventStore.open(store_url) as store:
            return store.read_log(run_id)

    return await trio.to_thread.run_sync(read)


async def raw_sql(store_url: str, statement: str, **params: Any) -> None:
    def run() -> None:
        engine = sqlalchemy.create_engine(normalize_store_url(store_url))
        try:
            with engine.begin() as connection:
                connection.execute(sqlalchemy.text(statement), params)
        finally:
            engine.dispose()

    await trio.to_thread.run_sync(run)


async def register(
    server: Server,
    providers,
    plan=(),
    *,
    tools=None,
    final_text="done",
    extra="",
    name=None,
    script=None,
    **provider_kwargs,
):
    """An agent aimed at a fresh scripted provider; returns (agent hash, provider)."""
    provider = providers(script or tool_loop_script(plan, final_text=final_text), **provider_kwargs)
    tools = sorted({tool for tool, _ in plan}) if tools is None else tools
    agent = await server.register_agent(
        agent_toml(provider.base_url, tools=tools, extra=extra, name=name)
    )
    return agent, provider


async def rested(
    server: Server, agent: str, run_input: Any = None, **fields: Any
) -> tuple[str, dict]:
    run_id = await server.start_run(agent, run_input, **fields)
    return run_id, await server.wait_resting(run_id)


async def seed_run(
    server: Server, agent: str, *events, run_id: str | None = None, **started: Any
) -> str:
    """Record a run's log without driving it: what a crashed daemon (or the CLI) leaves behind."""
    run_id = run_id or str(uuid.uuid4())
    events = (RunStarted(agent_def_hash=agent, input=None, **started), *events)
    await server.state.runtime.access.append(run_id, list(events), EMPTY_VIEW)
    return run_id


async def get_run(server: Server, run_id: str) -> dict:
    response = await server.client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    return response.json()


async def list_entry(server: Server, run_id: str) -> dict:
    response = await server.client.get("/v1/runs")
    assert response.status_code == 200, response.text
    (entry,) = [e for e in response.json()["runs"] if e["run"] == run_id]
    return entry


class Gate:
    """A provider hook that holds every model call until released
    (runs in the provider's thread)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.arrived = threading.Event()

    def __call__(self, call) -> None:
        self.arrived.set()
        self.open.wait(timeout=30)

    async def wait_arrived(self) -> None:
        await trio.to_thread.run_sync(self.arrived.wait, 30)
        assert self.arrived.is_set()


async def killed_in_a_write(
    store_url: str,
    tmp_path: Path,
    invoice: str,
    labels: dict[str, str] | None = None,
    *,
    kill_in: str = "issue_refund",
) -> str:
    """A built-in run the CLI left with a dangling ``issue_refund`` (killed inside it, at the
    fault point ``kill_in``), in the store at ``store_url``. One invoice per run: a second refund
    of an invoice waits on the first's open claim."""
    agent = tmp_path / "refund-desk.toml"
    agent.write_text(REFUND_DESK.read_text())
    flags = [a for key, value in (labels or {}).items() for a in ("--label", f"{key}={value}")]
    run = functools.partial(
        run_salvor,
        ["run", str(agent), "--store", store_url, "--json", *flags]
        + ["--input", json.dumps({"invoice_id": invoice})],
        env={**os.environ, "SALVOR_FAULT_KILL_IN_TOOL": kill_in},
        capture_output=True,
        text=True,
    )
    result = await trio.to_thread.run_sync(run)
    return json.loads(result.stdout.splitlines()[0])["run"]
