"""What a run's page and the inbox say of a run, in a real browser against a real daemon: its
labels; the re-run offered only where the daemon can re-run; a graph run named by its graph and
costed with its map's children; an inbox card that says which run and node waits; and a page that
asks the daemon nothing it must refuse.

The daemon (demo model and tools, no token) and the headless Chromium are the package's
(conftest.py); each test sets its runs up over the API and waits on DOM conditions. The re-run
test needs process agents, which a daemon on TCP takes only with a token: it has a daemon of its
own, with one, and logs its browser in first.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.dashboard.page import (
    AGENTS,
    GRAPHS,
    REPO,
    Page,
    log_in,
    page_on_a_daemon,
    parked_client_write,
)
from tests.daemon.dashboard.test_inbox import TICKET_GATE
from tests.support.scripted_provider import ScriptedProvider, text_reply

# The token of the re-run test's daemon (it runs process agents).
TOKEN = "page-process-token-7c41d9e2"


@pytest.fixture
def page(shared_page: Page) -> Page:
    """The package's daemon and browser (conftest.py)."""
    return shared_page


@pytest.fixture(scope="module")
def process_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """A daemon that takes process agents (so a token), their model calls answered by the
    scripted provider, and a browser logged in to it."""
    with ScriptedProvider(lambda call: text_reply("stamped")) as provider:
        upstream = {"SALVOR_AGENT_UPSTREAM": provider.base_url, "SALVOR_AGENT_KEY": "page-key"}
        with page_on_a_daemon(
            tmp_path_factory.mktemp("page-process"),
            "--allow-process-agents",
            token=TOKEN,
            env=upstream,
        ) as opened:
            log_in(opened, TOKEN)
            yield opened


def summary_drawn(page: Page, run_id: str, state: str) -> None:
    """Wait until the run's page shows ``run_id`` in ``state`` with what it runs named."""
    page.wait(
        lambda d: (
            page.text_of("[data-test=run-id]") == run_id
            and page.data("[data-test=run-status]", "state") == state
            and page.text_of("[data-test=run-what]")
        ),
        f"the page of run {run_id}, {state}",
    )


def failed_requests(page: Page) -> list[str]:
    """What the browser's console logged since it was last read: a refused request is logged as a
    failed resource load with its status."""
    return [
        entry["message"]
        for entry in page.driver.get_log("browser")
        if "Failed to load resource" in entry["message"]
        or "Content Security Policy" in entry["message"]
    ]


def test_a_runs_page_shows_the_labels_it_was_started_with(page: Page) -> None:
    run_id = page.start_run(
        AGENTS / "refund-desk.toml", {"invoice_id": "INV-L1"}, labels={"desk": "eu", "build": "42"}
    )
    page.wait_state(run_id, "completed")
    assert page.call("GET", f"/v1/runs/{run_id}")["labels"] == {"desk": "eu", "build": "42"}

    page.open(f"#/runs/{run_id}")
    summary_drawn(page, run_id, "completed")
    chips = page.driver.execute_script(
        "return [...document.querySelectorAll('[data-test=run-labels] [data-test=label]')]"
        ".map(e => e.textContent)"
    )
    assert sorted(chips) == ["build: 42", "desk: eu"]
    page.screenshot("run-labels")


def test_a_non_graph_runs_page_asks_for_no_graph(page: Page) -> None:
    run_id = page.start_run(AGENTS / "refund-desk.toml", {"invoice_id": "INV-N1"})
    page.wait_state(run_id, "completed")
    # The daemon refuses a graph for an agent run: a page that asked would log it.
    refused = page.api.get(f"/v1/runs/{run_id}/graph")
    assert refused.status_code == 409, refused.text
    page.open("#/runs")
    page.find(f'[data-test=run-row][data-run="{run_id}"]')
    failed_requests(page)  # what earlier tests left in the log

    page.open(f"#/runs/{run_id}")
    summary_drawn(page, run_id, "completed")
    page.wait(lambda d: page.text_of('[data-test=event][data-kind="RunCompleted"]'), "the timeline")
    assert page.driver.find_element("css selector", "[data-test=run-graph]").get_attribute("hidden")
    assert failed_requests(page) == []

    # Nor a client's run, whose agent hash names no agent the daemon holds.
    client = parked_client_write(page, "po-quiet")
    page.open(f"#/runs/{client}")
    summary_drawn(page, client, "needs_reconciliation")
    page.find("[data-test=run-waiting] [data-test=card-origin][data-ready]", "the card's origin")
    assert page.text_of("[data-test=run-what]") == "agent cccccccc…, driven by a client"
    assert failed_requests(page) == []


def process_agent(tmp_path: Path) -> Path:
    """A program agent that makes one model call (the package's scripted provider answers it) and
    prints the answer: its run, and a re-run of it, complete at once."""
    program = tmp_path / "stamp.py"
    program.write_text(
        "import os, openai\n"
        "answer = openai.OpenAI(max_retries=0).chat.completions.create(\n"
        "    model='scripted-model',\n"
        "    messages=[{'role': 'user', 'content': os.environ['SALVOR_PROMPT']}],\n"
        ")\n"
        "print(answer.choices[0].message.content)\n"
    )
    definition = tmp_path / "stamp.toml"
    command = [sys.executable, str(program)]
    definition.write_text(
        f'name = "stamp"\nkind = "process"\ncommand = {json.dumps(command)}\ntimeout = 30\n'
    )
    return definition


def test_re_run_is_offered_only_where_the_daemon_can_re_run(process_page: Page, tmp_path) -> None:
    page = process_page
    # A built-in agent's completed run: the daemon refuses a re-run of it.
    built_in = page.start_run(AGENTS / "refund-desk.toml", {"invoice_id": "INV-R2"})
    page.wait_state(built_in, "completed")
    assert page.api.post("/v1/runs", json={"replay_of": built_in}).status_code == 400
    # A run still waiting on a person: it has no whole trajectory to re-run.
    waiting = page.start_run(
        REPO / "contrib/curl/refund-with-approval.toml", {"invoice_id": "INV-R3"}
    )
    page.wait_state(waiting, "suspended")
    # A graph run: a re-run is of an agent's run.
    gated = page.start_graph_run(TICKET_GATE)
    page.wait_state(gated, "suspended")
    page.call("POST", f"/v1/runs/{gated}/resume", 202, json={"input": {"ticket": "T-1"}})
    page.wait_state(gated, "completed")
    for run_id, state in ((built_in, "completed"), (waiting, "suspended"), (gated, "completed")):
        page.open(f"#/runs/{run_id}")
        summary_drawn(page, run_id, state)
        page.find("[data-test=run-actions]")
        assert not page.driver.find_elements("css selector", "[data-test=action-rerun]"), run_id

    # A program agent's completed run: the daemon re-runs it, and the page offers it.
    origin = page.start_run(process_agent(tmp_path), "stamp it")
    page.wait_state(origin, "completed")
    page.open(f"#/runs/{origin}")
    summary_drawn(page, origin, "completed")
    agent = page.call("GET", f"/v1/runs/{origin}")["agent_def_hash"]
    assert page.call("GET", f"/v1/agents/{agent}")["kind"] == "process"
    page.click("[data-test=action-rerun]", "the re-run action")
    page.wait(lambda d: page.text_of("[data-test=replay-of-link]"), "the re-run's page")
    rerun = page.text_of("[data-test=run-id]")
    assert rerun != origin
    assert page.wait_state(rerun, "completed")
    assert page.call("GET", f"/v1/runs/{rerun}")["replay_of"] == origin


def graph_name(graph_hash: str) -> str:
    return f"graph {graph_hash.removeprefix('sha256:')[:8]}…"


def test_a_graph_run_is_named_by_its_graph_not_its_first_node(page: Page) -> None:
    run_id = page.start_graph_run(TICKET_GATE)
    page.wait_state(run_id, "suspended")
    name = graph_name(page.call("GET", f"/v1/runs/{run_id}")["graph_hash"])

    page.open("#/runs")
    row = f'[data-test=run-row][data-run="{run_id}"]'
    page.find(row)
    page.wait(lambda d: page.text_of(f"{row} [data-test=run-what]") == name, "the graph's name")
    options = page.driver.execute_script(
        "return [...document.querySelectorAll('[data-test=filter-graph] option')]"
        ".map(o => o.textContent)"
    )
    assert any(option.startswith(name) for option in options), options
    # Its entry node ("close") names a node, not the graph.
    assert not any("close" in option for option in options), options

    page.open(f"#/runs/{run_id}")
    summary_drawn(page, run_id, "suspended")
    assert page.text_of("[data-test=run-what]") == name


def test_a_map_graph_runs_usage_counts_its_items_child_runs(page: Page) -> None:
    page.register(AGENTS / "ticket-triage.toml")
    document = json.loads((GRAPHS / "tickets.json").read_text())
    run_input = json.loads((GRAPHS / "tickets.input.json").read_text())
    run_id = page.start_graph_run(document, run_input)
    page.wait_state(run_id, "completed", 60)
    children = page.call("GET", "/v1/runs", params={"label": f"salvor.map_of:{run_id}"})["runs"]
    assert len(children) == len(run_input["tickets"])
    spent = {
        key: sum(child["usage"][key] for child in children)
        for key in ("input_tokens", "output_tokens")
    }
    assert spent["input_tokens"] > 0 and spent["output_tokens"] > 0
    # The graph's own nodes call no model: its usage is its items'.
    run = page.call("GET", f"/v1/runs/{run_id}")
    assert run["usage"] == spent
    listed = page.call("GET", "/v1/runs", params={"graph": run["graph_hash"]})["runs"]
    assert next(entry for entry in listed if entry["run"] == run_id)["usage"] == spent

    shown = f"{spent['input_tokens']} in / {spent['output_tokens']} out"
    page.open(f"#/runs/{run_id}")
    summary_drawn(page, run_id, "completed")
    assert page.text_of("[data-test=run-usage]") == shown
    page.open("#/runs")
    row = f'[data-test=run-row][data-run="{run_id}"]'
    page.find(row)
    assert page.text_of(f"{row} [data-test=run-usage]") == shown


def card_origin(page: Page, run_id: str) -> str:
    card = f'[data-test=inbox-item][data-run="{run_id}"]'
    page.find(f"{card} [data-test=card-origin][data-ready]", f"what run {run_id} is")
    return page.text_of(f"{card} [data-test=card-origin]")


def test_an_inbox_card_says_which_run_and_node_waits(page: Page) -> None:
    gated = page.start_graph_run(TICKET_GATE)
    approval = page.start_run(
        REPO / "contrib/curl/refund-with-approval.toml", {"invoice_id": "INV-C1"}
    )
    asker = page.register(AGENTS / "ask-operator.toml")
    asking = {
        "schema_version": 1,
        "nodes": [
            {
                "id": "ask_each",
                "kind": "map",
                "name": "Ask each",
                "over": "$input.questions",
                "body": {"kind": "agent", "agent": asker, "input": "$item"},
            }
        ],
        "edges": [],
    }
    mapped = page.start_graph_run(asking, {"questions": [{"question": "Ship?", "type": "confirm"}]})
    client = parked_client_write(page, "po-origin")
    page.wait_state(gated, "suspended")
    page.wait_state(approval, "suspended")
    (item,) = page.wait(
        lambda d: [
            child["run"]
            for child in page.call("GET", "/v1/runs", params={"label": f"salvor.map_of:{mapped}"})[
                "runs"
            ]
            if child["status"]["state"] == "suspended"
        ],
        "the map's item waiting on its question",
    )

    failed_requests(page)  # what earlier tests left in the log
    page.open("#/inbox")
    gate_graph = graph_name(page.call("GET", f"/v1/runs/{gated}")["graph_hash"])
    assert card_origin(page, gated) == f"{gate_graph} · at node Close the ticket (close)"
    assert card_origin(page, approval) == "agent refund-with-approval"
    assert card_origin(page, item) == (
        f"agent ask-operator · item of map node Ask each (ask_each) in run {mapped[:8]}…"
    )
    # A client-driven run's agent hash is its client's word: the daemon holds no such agent.
    assert card_origin(page, client) == "agent cccccccc… · driven by a client"
    parent = page.find(
        f'[data-test=inbox-item][data-run="{item}"] [data-test=origin-parent]', "the parent's link"
    )
    assert parent.get_attribute("href").endswith(f"#/runs/{mapped}")
    for run_id in (gated, approval, item, client):
        link = f'[data-test=inbox-item][data-run="{run_id}"] [data-test=inbox-run]'
        assert page.find(link).get_attribute("href").endswith(f"#/runs/{run_id}")
    # Finding all that out asked the daemon nothing it refused.
    assert failed_requests(page) == []
    page.screenshot("inbox-origins")
