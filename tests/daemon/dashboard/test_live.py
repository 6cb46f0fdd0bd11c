"""The page live in a real browser against a real daemon: the run list's rows and a run's
timeline change as the daemon commits, and a graph run's nodes change state on its canvas, all
over the one WebSocket and without a reload.

The daemon (demo model and tools, no token) and the headless Chromium are the package's
(conftest.py); each test sets its runs up over the API and waits on DOM conditions.
"""

from __future__ import annotations

import json
import re

import pytest
from selenium.webdriver.common.by import By

from tests.daemon.dashboard.page import AGENTS, GRAPHS, REPO, Page

# A graph run that sleeps for an hour.
NAP = {
    "schema_version": 1,
    "nodes": [{"id": "nap", "kind": "delay", "seconds": 3600}],
    "edges": [],
}


@pytest.fixture
def page(shared_page: Page) -> Page:
    """The package's daemon and browser (conftest.py)."""
    return shared_page


def timeline_kinds(page: Page) -> list[str]:
    return page.driver.execute_script(
        "return [...document.querySelectorAll('[data-test=event]')].map(e => e.dataset.kind)"
    )


def test_a_runs_events_and_the_run_list_change_live_without_a_reload(page: Page) -> None:
    gated = page.start_run(REPO / "contrib/curl/refund-with-approval.toml", {"invoice_id": "INV-7"})
    page.wait_state(gated, "suspended")

    # The list: a run started now appears and moves on without a reload.
    page.open("#/runs")
    page.find(f'[data-test=run-row][data-run="{gated}"]')
    page.mark_the_document()
    other = page.start_run(AGENTS / "refund-desk.toml", {"invoice_id": "INV-8"}, labels={"k": "v"})
    row = f'[data-test=run-row][data-run="{other}"]'
    page.find(row, "the new run's row")
    page.wait(
        lambda d: page.data(row, "state") == "completed",
        "the new run's row reaching completed",
    )
    assert "k: v" in page.text_of(row)
    page.screenshot("runs-live")

    # A run's page: the recorded events, then the ones a resume records, as they land.
    page.open(f"#/runs/{gated}")
    page.wait(lambda d: "Suspended" in timeline_kinds(page), "the timeline up to the gate")
    page.mark_the_document()
    before = timeline_kinds(page)
    assert before[0] == "RunStarted" and before[-1] == "Suspended"
    assert "ModelCallCompleted" in before and "ToolCallRequested" in before
    page.call("POST", f"/v1/runs/{gated}/resume", 202, json={"input": {"approved": True}})
    page.wait(lambda d: "RunCompleted" in timeline_kinds(page), "the run's completion, live")
    after = timeline_kinds(page)
    assert after[: len(before)] == before and after[len(before)] == "Resumed"
    seqs = page.driver.execute_script(
        "return [...document.querySelectorAll('[data-test=event]')].map(e => +e.dataset.seq)"
    )
    assert seqs == list(range(len(seqs)))  # each event once, in order
    page.wait(
        lambda d: page.data("[data-test=run-status]", "state") == "completed",
        "the status reaching completed",
    )
    # A tool call shows its effect and key; a model call its usage.
    tools = page.text_of('[data-test=event][data-kind="ToolCallRequested"]')
    assert "read" in tools or "write" in tools
    assert " in / " in page.text_of('[data-test=event][data-kind="ModelCallCompleted"]')
    assert page.still_the_same_document()
    page.screenshot("run")


def node_states(page: Page) -> dict[str, str]:
    return page.driver.execute_script(
        "const nodes = document.querySelectorAll('[data-test=run-graph] [data-node]');"
        "return Object.fromEntries([...nodes].map(g => [g.dataset.node, g.dataset.state]))"
    )


def test_a_graph_runs_nodes_change_state_on_the_canvas(page: Page) -> None:
    for name in ("researcher.toml", "drafter.toml"):
        page.register(AGENTS / name)
    document = json.loads((GRAPHS / "publish.json").read_text())
    run_input = json.loads((GRAPHS / "publish.input.json").read_text())
    run_id = page.start_graph_run(document, run_input)
    page.wait_state(run_id, "suspended")

    page.open(f"#/runs/{run_id}")
    page.wait(lambda d: node_states(page).get("approve") == "waiting", "the gate waiting")
    page.mark_the_document()
    states = node_states(page)
    assert set(states) == {node["id"] for node in document["nodes"]}
    assert states["research"] == states["draft"] == "completed"
    assert states["publish"] == states["route"] == "pending"
    page.driver.execute_script("document.querySelector('[data-test=run-graph]').scrollIntoView()")
    page.screenshot("graph")

    page.call("POST", f"/v1/runs/{run_id}/resume", 202, json={"input": {"approved": True}})
    page.wait(lambda d: node_states(page).get("publish") == "completed", "publish done, live")
    states = node_states(page)
    assert states["approve"] == states["route"] == "completed"
    assert states["tell_author"] == "skipped"
    assert page.still_the_same_document()


def test_a_fork_shows_its_write_hazard_and_needs_each_write_acknowledged(page: Page) -> None:
    for name in ("researcher.toml", "drafter.toml"):
        page.register(AGENTS / name)
    document = json.loads((GRAPHS / "publish.json").read_text())
    run_input = json.loads((GRAPHS / "publish.input.json").read_text())
    origin = page.start_graph_run(document, run_input)
    page.wait_state(origin, "suspended")
    page.call("POST", f"/v1/runs/{origin}/resume", 202, json={"input": {"approved": True}})
    page.wait_state(origin, "completed")
    # The daemon refuses a fork that would publish again unacknowledged (it creates nothing).
    refused = page.api.post(f"/v1/runs/{origin}/fork", json={"from_node": "publish"})
    assert refused.status_code == 409, refused.text

    page.open(f"#/runs/{origin}")
    page.find("[data-test=action-fork]", "the fork action").click()
    select = page.find("[data-test=fork-node]")
    select.find_element(By.CSS_SELECTOR, 'option[value="publish"]').click()
    page.driver.find_element(By.CSS_SELECTOR, "[data-test=fork-preview]").click()
    page.find("[data-test=fork-write]", "the write the fork would fire again")
    assert "publish_post" in page.text_of("[data-test=fork-hazard]")
    # So the page offers no fork until every write it lists is ticked.
    confirm = page.driver.find_element(By.CSS_SELECTOR, "[data-test=fork-confirm]")
    assert not confirm.is_enabled()
    page.screenshot("fork-hazard")
    ticks = page.driver.find_elements(By.CSS_SELECTOR, "[data-test=fork-ack]")
    assert ticks
    for tick in ticks:
        assert not confirm.is_enabled()
        tick.click()
    assert confirm.is_enabled()
    ticks[0].click()
    assert not confirm.is_enabled()
    ticks[0].click()
    confirm.click()
    (fork,) = page.wait(lambda d: page.call("GET", f"/v1/runs/{origin}/forks")["forks"], "the fork")
    page.wait(lambda d: d.current_url.endswith(f"#/runs/{fork['run']}"), "the fork's page")
    page.wait_state(fork["run"], "completed")
    assert fork["from_node"] == "publish" and fork["acknowledged_writes"]


def test_a_refused_action_shows_the_daemons_message_as_is(page: Page) -> None:
    napping = page.start_graph_run(NAP)
    page.wait_state(napping, "sleeping")
    # A resume before the timer is due is refused, and records nothing.
    refused = page.api.post(f"/v1/runs/{napping}/resume")
    assert refused.status_code == 409, refused.text
    events = page.call("GET", f"/v1/runs/{napping}")["event_count"]

    page.open(f"#/runs/{napping}")
    page.click("[data-test=action-resume]", "the resume action")
    # Word for word, but for the seconds left, which count down between the two asks.
    message = re.sub(r"another \d+s", "another …", refused.json()["error"]["message"])
    assert message != refused.json()["error"]["message"]
    page.wait(
        lambda d: (
            re.sub(r"another \d+s", "another …", page.text_of("[data-test=action-error]"))
            == message
        ),
        "the refusal, word for word",
    )
    assert page.call("GET", f"/v1/runs/{napping}")["event_count"] == events
    page.call("POST", f"/v1/runs/{napping}/abandon", json={})


def test_the_run_list_filters_by_agent_status_and_label_through_the_api(page: Page) -> None:
    # The package's runs so far (agents, graphs, a fork) and the ones of each kind wanted here.
    desk = page.register(AGENTS / "refund-desk.toml")
    unlabelled = page.start_run(AGENTS / "refund-desk.toml", {"invoice_id": "INV-F0"})
    page.wait_state(unlabelled, "completed")
    labelled = page.start_run(
        AGENTS / "refund-desk.toml", {"invoice_id": "INV-F1"}, labels={"desk": "eu"}
    )
    page.wait_state(labelled, "completed")
    waiting = page.start_run(
        REPO / "contrib/curl/refund-with-approval.toml", {"invoice_id": "INV-F2"}
    )
    page.wait_state(waiting, "suspended")
    page.open("#/runs")
    page.find(f'[data-test=run-row][data-run="{labelled}"]')
    page.wait(
        lambda d: "refund-desk" in page.text_of(f'[data-run="{labelled}"]'), "its agent's name"
    )
    page.screenshot("runs")

    def shown() -> list[str]:
        return page.driver.execute_script(
            "return [...document.querySelectorAll('[data-test=run-row]')].map(e => e.dataset.run)"
        )

    def listed(**query) -> list[str]:
        return [r["run"] for r in page.call("GET", "/v1/runs", params=query)["runs"]]

    page.find(f'[data-test=filter-agent] option[value="{desk}"]').click()
    page.find('[data-test=filter-status] option[value="completed"]').click()
    page.driver.find_element(By.CSS_SELECTOR, "[data-test=filter-apply]").click()
    expected = listed(agent=desk, status="completed")
    assert len(expected) >= 2
    page.wait(lambda d: shown() == expected, "the agent's completed runs")
    assert "agent=" in page.driver.current_url  # the filter is in the hash: a link keeps it

    label = page.find("[data-test=filter-label]")
    label.send_keys("desk:eu")
    page.driver.find_element(By.CSS_SELECTOR, "[data-test=filter-apply]").click()
    page.wait(lambda d: shown() == [labelled], "the one labelled run")


def test_after_the_daemon_restarts_the_page_resumes_each_run_from_its_cursor(page: Page) -> None:
    gated = page.start_run(
        REPO / "contrib/curl/refund-with-approval.toml", {"invoice_id": "INV-D1"}
    )
    page.wait_state(gated, "suspended")
    page.open(f"#/runs/{gated}")
    page.wait(lambda d: "Suspended" in timeline_kinds(page), "the timeline up to the gate")
    page.wait(lambda d: page.data("[data-test=live-state]", "state") == "live", "the socket")
    page.mark_the_document()
    before = timeline_kinds(page)

    # The daemon dies (SIGKILL: the socket drops without a close frame) and starts again on the
    # same port and store.
    page.daemon.kill()
    page.wait(lambda d: page.data("[data-test=live-state]", "state") != "live", "the drop")
    page.daemon.start()
    page.wait(lambda d: page.data("[data-test=live-state]", "state") == "live", "the reconnect")
    page.call("POST", f"/v1/runs/{gated}/resume", 202, json={"input": {"approved": True}})
    page.wait(lambda d: "RunCompleted" in timeline_kinds(page), "the events after the restart")
    seqs = page.driver.execute_script(
        "return [...document.querySelectorAll('[data-test=event]')].map(e => +e.dataset.seq)"
    )
    assert seqs == list(range(len(seqs)))  # no gap, no event twice
    assert timeline_kinds(page)[: len(before)] == before
    assert page.still_the_same_document()


def test_a_run_links_its_children_and_a_child_its_parent(page: Page) -> None:
    page.register(AGENTS / "fact-checker.md", "text/markdown")
    task = {
        "agent": "fact-checker",
        "task": "Check it.",
        "inputs": {"claim": "Tides follow the Moon."},
    }
    parent = page.start_run(AGENTS / "editor-in-chief.toml", task)
    page.wait_state(parent, "completed")
    (child,) = [c["run"] for c in page.call("GET", f"/v1/runs/{parent}/children")["children"]]

    page.open(f"#/runs/{parent}")
    page.click("[data-test=children] [data-test=child-link]", "the child's link")
    page.wait(lambda d: d.current_url.endswith(f"#/runs/{child}"), "the child's page")
    page.wait(lambda d: page.text_of("[data-test=run-id]") == child, "the child's page drawn")
    page.click("[data-test=parent-link]", "the link back to the parent")
    page.wait(lambda d: page.text_of("[data-test=run-id]") == parent, "the parent's page again")


def test_the_run_list_pages_by_the_apis_cursor(page: Page) -> None:
    started = [
        page.start_run(AGENTS / "refund-desk.toml", {"invoice_id": f"INV-P{n}"}) for n in range(3)
    ]
    for run_id in started:
        page.wait_state(run_id, "completed")
    first = page.call("GET", "/v1/runs", params={"limit": 2})
    second = page.call("GET", "/v1/runs", params={"limit": 2, "cursor": first["next_cursor"]})

    def shown() -> list[str]:
        return page.driver.execute_script(
            "return [...document.querySelectorAll('[data-test=run-row]')].map(e => e.dataset.run)"
        )

    page.open("#/runs?limit=2")
    page.wait(lambda d: shown() == [r["run"] for r in first["runs"]], "the first page")
    page.click("[data-test=page-next]")
    page.wait(lambda d: shown() == [r["run"] for r in second["runs"]], "the second page")
    page.click("[data-test=page-first]")
    page.wait(lambda d: shown() == [r["run"] for r in first["runs"]], "the first page again")


# The runs screen's read of its list (``#/runs?limit=49``), held in the browser until released.
HOLD_THE_LIST = """
const real = window.fetch;
window.__heldLists = [];
window.fetch = async (...args) => {
  const response = await real(...args);
  if (String(args[0]) === "/v1/runs?limit=49") {
    await new Promise((release) => window.__heldLists.push(release));
  }
  return response;
};
window.__releaseLists = () => {
  window.fetch = real;
  for (const release of window.__heldLists) release();
};
"""


def test_a_row_heard_live_while_the_list_loads_is_not_taken_back_by_the_list(page: Page) -> None:
    gated = page.start_run(REPO / "contrib/curl/refund-with-approval.toml", {"invoice_id": "INV-9"})
    page.wait_state(gated, "suspended")
    page.open("#/runs")
    # A run started now shows up live: the page's watch of the run list is in place.
    probe = page.start_run(AGENTS / "refund-desk.toml", {"invoice_id": "INV-10"})
    page.find(f'[data-test=run-row][data-run="{probe}"]', "the probe run's live row")
    # The list is read again, and its answer (the gated run suspended) held in the browser
    # while the run is resumed and completes, and its live row says so.
    page.driver.execute_script(HOLD_THE_LIST)
    page.driver.execute_script("location.hash = '#/runs?limit=49'")
    page.wait(lambda d: d.execute_script("return window.__heldLists.length") == 1, "the list held")
    page.call("POST", f"/v1/runs/{gated}/resume", 202, json={"input": {"approved": True}})
    page.wait_state(gated, "completed")
    row = f'[data-test=run-row][data-run="{gated}"]'
    page.wait(lambda d: page.data(row, "state") == "completed", "the gated run's live row")
    page.driver.execute_script("document.querySelector(arguments[0]).__live = true", row)
    page.driver.execute_script("window.__releaseLists()")
    page.wait(
        lambda d: (
            d.execute_script("return document.querySelector(arguments[0])?.__live", row) is None
        ),
        "the list drawn",
    )
    assert page.data(row, "state") == "completed"
