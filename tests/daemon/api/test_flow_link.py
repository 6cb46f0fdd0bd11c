"""A flow sent over a link: ``POST /v1/graph-runs`` with the flow file and its members in the body,
against a real `salvor serve` whose working directory is an empty directory of its own. The
project is deleted once the body is built, so the daemon can only have run the flow from what
the call carried.

Every member is checked before the document (422 ``invalid_flow_files``, nothing recorded), the
pre-check's refusals are a 400 ``invalid_graph`` naming each node (a process agent is refused
over a link), and a hash-named graph run is as before.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
from salvor.daemon.cli._flow_collect import collect_flow
from salvor.protocol import call_body

from tests.chaos.test_kill_serve import agent_toml
from tests.support.daemon_apart import daemon_apart
from tests.support.scripted_provider import ProviderCall, ScriptedProvider

SETTLE_SECONDS = 60.0

MAIN = """\
schema_version: 1
nodes:
  - {id: answer, kind: agent, agent_file: ../../agents/echo.toml}
  - {id: again, kind: flow, flow: inner, input: $nodes.answer}
edges:
  - {from: answer, to: again}
"""

INNER = """\
schema_version: 1
nodes:
  - {id: echoed, kind: agent, agent_file: ../../agents/echo.toml}
edges: []
"""


def _echo(call: ProviderCall):
    text = call.request["messages"][0]["content"][0]["text"]
    answer = {"model": call.request["model"], "content": [{"type": "text", "text": f"<{text}>"}]}
    return {**answer, "stop_reason": "end_turn"}, {"input_tokens": 3, "output_tokens": 2}


def _body(tmp_path: Path, base_url: str, *, agent: str | None = None) -> dict:
    """The call body for the project's flow `main`, the project deleted once it is built."""
    project = tmp_path / "proj"
    flows = project / ".salvor" / "flows"
    flows.mkdir(parents=True)
    (project / "agents").mkdir()
    (project / "agents" / "echo.toml").write_text(
        agent or agent_toml(base_url, name="echo", tools=[])
    )
    (flows / "main.yaml").write_text(MAIN)
    (flows / "inner.yaml").write_text(INNER)
    files = collect_flow(str(flows / "main.yaml"))
    shutil.rmtree(project)
    return call_body(files.bundle, dict(files.contents))


@pytest.fixture
def link(tmp_path: Path, store_url: str):
    """A real daemon on ``store_url`` in a directory of its own, and the scripted provider."""
    with ScriptedProvider(_echo) as provider:
        daemon = daemon_apart(tmp_path, store_url, provider)
        daemon.start()
        try:
            with daemon.client(timeout=30) as client:
                yield client, provider
        finally:
            daemon.kill()


def _runs(client: httpx.Client) -> list:
    response = client.get("/v1/runs")
    assert response.status_code == 200, response.text
    return response.json()["runs"]


def _error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    return body["error"]


def test_a_flow_sent_with_the_call_runs_from_its_members_alone(tmp_path: Path, link) -> None:
    client, provider = link
    capabilities = client.get("/v1/capabilities").json()["capabilities"]
    assert capabilities["flow_members"] is True
    body = _body(tmp_path, provider.base_url)
    started = client.post("/v1/graph-runs", json={**body, "input": "tide"})
    assert started.status_code == 201, started.text
    run_id = started.json()["run"]
    deadline = time.monotonic() + SETTLE_SECONDS
    resting = ("completed", "failed", "abandoned", "suspended", "needs_reconciliation")
    while (status := client.get(f"/v1/runs/{run_id}").json()["status"])["state"] not in resting:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    assert status == {"state": "completed", "output": {"again": {"echoed": "<<tide>>"}}}
    events = client.get(f"/v1/runs/{run_id}/events", headers={"Accept": "application/json"})
    assert events.status_code == 200, events.text
    assert len(provider.calls) == 2


def test_bad_bytes_refuse_the_call_whole_members_before_the_document(tmp_path: Path, link) -> None:
    client, provider = link
    body = _body(tmp_path, provider.base_url)
    before = _runs(client)
    agent = next(i for i, m in enumerate(body["members"]) if m["role"] == "agent")

    def sent(change) -> httpx.Response:
        call = json.loads(json.dumps(body))
        change(call)
        return client.post("/v1/graph-runs", json=call)

    def bad_member_and_document(call: dict) -> None:
        call["members"][agent]["content"] = "not base64!"
        call["flow"]["content"] = "nor this!"

    error = _error(sent(bad_member_and_document), 422, "invalid_flow_files")
    assert error["message"].startswith(f"members[{agent}]") and "base64" in error["message"]

    def wrong_size(call: dict) -> None:
        call["members"][agent]["size"] += 1

    assert "declares" in _error(sent(wrong_size), 422, "invalid_flow_files")["message"]

    def over_the_cap(call: dict) -> None:
        call["members"][agent]["size"] = 32 * 1024 * 1024 + 1

    assert "32 MiB" in _error(sent(over_the_cap), 422, "invalid_flow_files")["message"]

    def by_upload(call: dict) -> None:
        call["members"][agent].pop("content")
        call["members"][agent]["upload_id"] = "up_1"

    assert "upload" in _error(sent(by_upload), 422, "invalid_flow_files")["message"]

    def bad_document(call: dict) -> None:
        call["flow"]["content"] = base64.b64encode(b"x").decode() + "%"

    assert "flow file" in _error(sent(bad_document), 422, "invalid_flow_files")["message"]

    def both(call: dict) -> None:
        call["graph_hash"] = "sha256:" + "0" * 64

    _error(sent(both), 400, "bad_request")

    def nul_in_the_input(call: dict) -> None:
        call["input"] = "a\x00b"  # a member's key may hold one; nothing the store keeps may

    assert "NUL" in _error(sent(nul_in_the_input), 400, "bad_request")["message"]
    assert _runs(client) == before


def test_the_pre_check_refuses_a_process_agent_and_an_unsent_member(tmp_path: Path, link) -> None:
    client, provider = link
    process = _body(tmp_path, provider.base_url, agent='kind = "process"\ncommand = ["true"]\n')
    error = _error(client.post("/v1/graph-runs", json=process), 400, "invalid_graph")
    codes = {(e["code"], e["node"]) for e in error["details"]["errors"]}
    assert ("process_agent_over_link", "answer") in codes

    body = _body(tmp_path, provider.base_url)
    body["members"] = [m for m in body["members"] if m["role"] != "agent"]
    error = _error(client.post("/v1/graph-runs", json=body), 400, "invalid_graph")
    # Each node that needs it is named, the nested flow's too.
    errors = error["details"]["errors"]
    assert {(e["code"], e["node"]) for e in errors} == {
        ("unknown_member", "answer"),
        ("unknown_member", "echoed"),
    }

    # A member without bytes or a state is refused, and the pre-check says so.
    body = _body(tmp_path, provider.base_url)
    for member in body["members"]:
        if member["role"] == "agent":
            member.pop("content")
            member.pop("size")
    error = _error(client.post("/v1/graph-runs", json=body), 400, "invalid_graph")
    assert {e["code"] for e in error["details"]["errors"]} == {"refused_member"}
    assert "neither its bytes nor a state" in error["details"]["errors"][0]["message"]
    assert _runs(client) == []
