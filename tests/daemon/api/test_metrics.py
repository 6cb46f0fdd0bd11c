"""``GET /metrics`` against the real daemon (``serve`` in process, over real HTTP), read with the
Prometheus client's own parser.

A few demo-model runs are driven to rest (completed ones, and a gated one suspended); the scrape
then agrees with the API: runs by state are what ``GET /v1/runs`` lists, and the append counters
grew by exactly the events the runs' logs hold. Both backends: the counts come from the store's
writer and its ``runs`` table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from salvor.protocol import RunState

from tests.daemon.api.test_mcp_agents import stdio_table
from tests.daemon.api.test_stream import Holds
from tests.support.api_server import TOKEN, Server, agent_toml
from tests.support.contract import DOCUMENT
from tests.support.mcp_servers import FixtureServer
from tests.support.scripted_provider import text_reply, tool_loop_script

REPO = Path(__file__).resolve().parents[3]
REFUND_DESK = (REPO / "contrib" / "agents" / "refund-desk.toml").read_text()
GATED = (
    'model = "demo-planner"\nsystem_prompt = "Ask first."\n[llm]\nprovider = "demo"\n'
    '[[tools]]\nname = "request_approval"\n'
)
# Every family the design names, by the name the parser gives it (a counter's without `_total`).
FAMILIES = {
    "salvor_runs": "gauge",
    "salvor_appends": "counter",
    "salvor_commits": "counter",
    "salvor_append_batches": "counter",
    "salvor_group_commit_events": "histogram",
    "salvor_commit_seconds": "histogram",
    "salvor_drivers_live": "gauge",
    "salvor_stream_subscribers": "gauge",
    "salvor_proxy_call_seconds": "histogram",
    "salvor_mcp_call_seconds": "histogram",
    "salvor_claims_held": "gauge",
    "salvor_reconciliations_open": "gauge",
}
WAIT = 30


async def scrape(server: Server) -> dict[str, dict[tuple, float]]:
    """``GET /metrics`` parsed: family name -> {(sample name, sorted labels): value}."""
    response = await server.client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    parsed: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.text):
        assert FAMILIES.get(family.name, family.type) == family.type, family
        samples = parsed.setdefault(family.name, {})
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return parsed


def value(scraped: dict, family: str, sample: str | None = None, **labels: str) -> float:
    return scraped[family][(sample or family, tuple(sorted(labels.items())))]


async def test_a_scrape_agrees_with_the_api_and_the_logs(server: Server) -> None:
    before = await scrape(server)
    assert FAMILIES.keys() <= before.keys()
    refunds = await server.register_agent(REFUND_DESK)
    gated = await server.register_agent(GATED)
    run_ids = [await server.start_run(refunds, {"invoice_id": f"INV-{n}"}) for n in range(3)]
    run_ids.append(await server.start_run(gated, "refund INV-9"))
    for run_id in run_ids:
        await server.wait_resting(run_id)
    # A drive lets its run go (in the store too) after its last append is durable: the scrape
    # that counts is the first with no drive left.
    with trio.fail_after(WAIT):
        while value(after := await scrape(server), "salvor_drivers_live") != 0:
            await trio.sleep(0.01)

    listed = (await server.client.get("/v1/runs")).json()["runs"]
    assert {run["run"] for run in listed} == set(run_ids)
    for state in RunState:
        expected = sum(run["status"]["state"] == state.value for run in listed)
        assert value(after, "salvor_runs", state=state.value) == expected, state
    assert value(after, "salvor_runs", state="completed") == 3
    assert value(after, "salvor_runs", state="suspended") == 1

    def grew(family: str, sample: str | None = None) -> float:
        return value(after, family, sample) - value(before, family, sample)

    appended = sum(run["event_count"] for run in listed)
    assert grew("salvor_appends", "salvor_appends_total") == appended
    commits = grew("salvor_commits", "salvor_commits_total")
    # Each run's head commits before its 201, so there are at least as many commits as runs; a
    # group commit may hold several runs' appends, never more commits than events.
    assert len(run_ids) <= commits <= appended
    # Each commit holds one append or more, each append one event or more.
    batches = grew("salvor_append_batches", "salvor_append_batches_total")
    assert commits <= batches <= appended
    histogram_counts = (
        "salvor_group_commit_events_count",
        "salvor_commit_seconds_count",
    )
    for sample in histogram_counts:
        assert grew(sample.removesuffix("_count"), sample) == commits
    assert grew("salvor_group_commit_events", "salvor_group_commit_events_sum") == appended
    assert 0 < grew("salvor_commit_seconds", "salvor_commit_seconds_sum") < commits * WAIT
    # The refunds' claims are settled by their completions; nothing is parked on a write.
    assert value(after, "salvor_claims_held") == 0
    assert value(after, "salvor_reconciliations_open") == 0
    # No process agent or MCP server here: each known wire and transport shows, at 0.
    for wire in ("openai.chat", "openai.responses", "anthropic.messages"):
        count = value(
            after, "salvor_proxy_call_seconds", "salvor_proxy_call_seconds_count", wire=wire
        )
        assert count == 0
    for transport in ("stdio", "http"):
        assert (
            value(
                after,
                "salvor_mcp_call_seconds",
                "salvor_mcp_call_seconds_count",
                transport=transport,
            )
            == 0
        )
    # No label carries a run id, or anything else the daemon did not choose.
    response = await server.client.get("/metrics")
    assert not any(run_id in response.text for run_id in run_ids)


async def test_a_live_drive_and_its_open_stream_are_counted_while_they_last(
    server: Server, providers
) -> None:
    holds = Holds(0)
    provider = providers([text_reply("done")], on_call=holds)
    try:
        run_id = await server.start_run(await server.register_agent(agent_toml(provider.base_url)))
        await holds.wait_reached(0)
        scraped = await scrape(server)
        assert value(scraped, "salvor_drivers_live") == 1
        assert value(scraped, "salvor_runs", state="awaiting_model") == 1
        assert value(scraped, "salvor_stream_subscribers", transport="sse") == 0
        async with server.new_client().stream("GET", f"/v1/runs/{run_id}/events") as events:
            assert events.status_code == 200
            # Held while the scrape runs: an abandoned line iterator, finalised, closes the stream.
            lines = events.aiter_lines()
            with trio.fail_after(WAIT):
                # The stream subscribes before it reads the log: its first frame proves it is in.
                while not (await anext(lines)).startswith("data:"):
                    pass
            scraped = await scrape(server)
            assert value(scraped, "salvor_stream_subscribers", transport="sse") == 1
            assert value(scraped, "salvor_stream_subscribers", transport="ws") == 0
            await lines.aclose()
    finally:
        holds.release_all()
    await server.wait_resting(run_id)
    # The drive lets its run go (in the store too) after its last append is durable, so a
    # scrape may still see it a moment after the run rests.
    with trio.fail_after(WAIT):
        while value(scraped := await scrape(server), "salvor_drivers_live") != 0:
            await trio.sleep(0.01)
    assert value(scraped, "salvor_stream_subscribers", transport="sse") == 0
    assert value(scraped, "salvor_runs", state="completed") == 1


# The bearer check and the refusal come before the store, on either backend alike.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_metrics_need_the_bearer_token(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        refused = await server.new_client(headers=headers).get("/metrics")
        assert refused.status_code == 401, headers
        assert refused.json()["error"]["code"] == "unauthorized"
        assert "salvor_" not in refused.text
    assert FAMILIES.keys() <= (await scrape(server)).keys()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_store_that_cannot_be_read_is_503_not_a_scrape_without_runs(
    server: Server, monkeypatch
) -> None:
    from salvor.store import StoreUnavailable

    def unreadable() -> None:
        raise StoreUnavailable("the store at test is down")

    monkeypatch.setattr(server.state.runtime.access.store.runs, "census", unreadable)
    refused = await server.client.get("/metrics")
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "store_unavailable"


def test_the_document_names_what_a_scrape_answers() -> None:
    # The contract test reads JSON answers only; this one's are text (200) and the envelope.
    responses = DOCUMENT["paths"]["/metrics"]["get"]["responses"]
    # 403: a session cookie's Origin refused, 429: a client that gave too many wrong tokens (the
    # caller check every guarded route shares).
    assert set(responses) == {"200", "401", "403", "429", "500", "503"}
    assert set(responses["200"]["content"]) == {"text/plain"}


# A process agent on the standard library alone (an SDK's import costs a second): one OpenAI chat
# call through the daemon's proxy, its answer printed.
TINY_AGENT = r"""
import json, os, urllib.request
question = {"role": "user", "content": os.environ["SALVOR_PROMPT"]}
body = {"model": "scripted-model", "messages": [question]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer placeholder"},
)
print(json.load(urllib.request.urlopen(request, timeout=30))["choices"][0]["message"]["content"])
"""


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_proxied_model_calls_and_mcp_tool_calls_are_timed_by_wire_and_transport(
    server_factory, providers, tmp_path, monkeypatch
) -> None:
    server = await server_factory(allow_process_agents=True)
    # A built-in agent whose two tools are a stdio MCP server's.
    fx_dir = tmp_path / "fx"
    fx_dir.mkdir()
    fx = FixtureServer(fx_dir)
    calling = providers(
        tool_loop_script([("lookup", {"key": "a"}), ("write_note", {"text": "n"})], final_text="ok")
    )
    mcp_agent = await server.register_agent(
        agent_toml(calling.base_url) + stdio_table(fx, 'effects = { lookup = "read" }\n')
    )
    # A process agent whose one model call goes through the daemon's proxy (OpenAI chat).
    upstream = providers([text_reply("settled")])
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", upstream.base_url)
    script = tmp_path / "tiny_agent.py"
    script.write_text(TINY_AGENT)
    process_agent = await server.register_agent(
        f'kind = "process"\ncommand = {json.dumps([sys.executable, "-I", str(script)])}\n'
        "timeout = 60\n"
    )
    runs = [await server.start_run(mcp_agent, "go"), await server.start_run(process_agent, "A-1")]
    for run_id in runs:
        body = await server.wait_resting(run_id)
        assert body["status"]["state"] == "completed", body
    scraped = await scrape(server)

    def count(family: str, **labels: str) -> float:
        return value(scraped, family, f"{family}_count", **labels)

    assert count("salvor_mcp_call_seconds", transport="stdio") == len(fx.ledger) == 2
    assert count("salvor_mcp_call_seconds", transport="http") == 0
    assert count("salvor_proxy_call_seconds", wire="openai.chat") == upstream.call_count == 1
    assert count("salvor_proxy_call_seconds", wire="anthropic.messages") == 0
    seconds = value(
        scraped, "salvor_proxy_call_seconds", "salvor_proxy_call_seconds_sum", wire="openai.chat"
    )
    assert 0 < seconds < WAIT
