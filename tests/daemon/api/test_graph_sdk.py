"""The contrib SDK's graph calls (``salvor_client.Salvor``) against a real daemon over HTTP, with
a bearer token: every call's answer, and every refusal raised as ``SalvorError`` with the
envelope's code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.api import register
from tests.support.api_server import TOKEN
from tests.support.backends import SQLITE_ONLY
from tests.support.graph_documents import EVERY_KIND_YAML, SUMMARY, every_kind, three_defects

# The SDK is a client of the routes; the routes' store behaviour is test_graphs.py's, on both.
STORE_BACKENDS = SQLITE_ONLY

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "contrib" / "sdk"))

from salvor_client import Salvor, SalvorError


async def test_the_sdk_submits_validates_lists_and_reads_graphs(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    async with Salvor(server.url, auth_token=TOKEN) as salvor:
        checked = await salvor.validate_graph(every_kind())
        assert checked["valid"] is True and checked["summary"] == SUMMARY
        assert await salvor.list_graphs() == []  # validating stored nothing

        created = await salvor.submit_graph(every_kind())
        assert created == {"graph": checked["graph"], "created": True}
        # The text of a YAML file is the same graph.
        assert await salvor.submit_graph(EVERY_KIND_YAML) == {**created, "created": False}
        assert await salvor.list_graphs() == [{"graph": created["graph"], **SUMMARY}]
        assert await salvor.get_graph(created["graph"]) == {
            "graph": created["graph"],
            "document": every_kind(),
        }

        document, codes = three_defects()
        invalid = await salvor.validate_graph(document)
        assert invalid["valid"] is False and {e["code"] for e in invalid["errors"]} == codes
        with pytest.raises(SalvorError) as refused:
            await salvor.submit_graph(document)
        assert (refused.value.status, refused.value.code) == (400, "invalid_graph")
        assert refused.value.details["errors"] == invalid["errors"]
        with pytest.raises(SalvorError) as missing:
            await salvor.get_graph("sha256:" + "0" * 64)
        assert (missing.value.status, missing.value.code) == (404, "unknown_graph")

    async with Salvor(server.url) as anonymous:
        with pytest.raises(SalvorError) as unauthorized:
            await anonymous.list_graphs()
        assert (unauthorized.value.status, unauthorized.value.code) == (401, "unauthorized")


def _refund_graph(agent: str) -> dict:
    """An agent, then a write (``issue_refund``), then an email: a fork from the write's node
    re-walks the write."""
    return {
        "schema_version": 1,
        "nodes": [
            {"id": "draft", "kind": "agent", "agent": agent, "input": "$input.invoice"},
            {
                "id": "refund",
                "kind": "tool",
                "tool": "issue_refund",
                "input": {"invoice_id": "$input.invoice", "amount_cents": 300},
            },
        ],
        "edges": [{"from": "draft", "to": "refund"}],
    }


async def test_the_sdk_starts_projects_and_forks_a_graph_run(server, providers) -> None:
    agent, provider = await register(server, providers, final_text="a refund note")
    async with Salvor(server.url) as salvor:
        graph = (await salvor.submit_graph(_refund_graph(agent)))["graph"]
        origin = await salvor.start_graph_run(
            graph, {"invoice": "INV-4"}, labels={"team": "billing"}
        )
        assert (await server.wait_resting(origin))["status"]["state"] == "completed"

        projection = await salvor.graph_projection(origin)
        assert projection["graph_hash"] == graph
        assert [(n["node"], n["state"]) for n in projection["nodes"]] == [
            ("draft", "exited"),
            ("refund", "exited"),
        ]
        assert await salvor.forks(origin) == []

        # The write re-walks: refused with every unacknowledged write, and nothing created.
        with pytest.raises(SalvorError) as hazard:
            await salvor.fork(origin, "refund")
        assert (hazard.value.status, hazard.value.code) == (409, "write_replay_hazard")
        (write,) = hazard.value.details["writes"]
        assert write["tool"] == "issue_refund"
        plan = await salvor.fork(origin, "refund", dry_run=True)
        assert (plan["dry_run"], plan["would_proceed"]) == (True, False)
        assert plan["unacknowledged_writes"] == [write["seq"]]
        assert await salvor.forks(origin) == []

        child = await salvor.fork(origin, "refund", acknowledge_writes=[write["seq"]])
        assert child["status"] == "running"
        assert child["forked_from"]["run_id"] == origin
        assert (await server.wait_resting(child["run"]))["status"]["state"] == "completed"
        assert (await salvor.graph_projection(child["run"]))["forked_from"]["from_node"] == "refund"
        assert provider.call_count == 1  # the draft came with the prefix
        forks = await salvor.forks(origin)
        assert [(f["run"], f["from_node"], f["acknowledged_writes"]) for f in forks] == [
            (child["run"], "refund", [write["seq"]])
        ]

        with pytest.raises(SalvorError) as missing:
            await salvor.start_graph_run("sha256:" + "0" * 64)
        assert (missing.value.status, missing.value.code) == (404, "unknown_graph")
