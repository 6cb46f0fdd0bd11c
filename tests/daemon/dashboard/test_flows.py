"""The Flows screen in a real browser against a real daemon: every flow kept by name, at its
current version (its number, its graph's hash, when it was written), and a link to the runs
started by that name."""

from __future__ import annotations

import pytest

from tests.daemon.dashboard.page import Page

GATE = {"schema_version": 1, "nodes": [{"id": "ok", "kind": "gate", "prompt": "Go?"}], "edges": []}
EDITED = {**GATE, "nodes": [{"id": "ok", "kind": "gate", "prompt": "Go now?"}]}


@pytest.fixture
def page(shared_page: Page) -> Page:
    """The package's daemon and browser (conftest.py)."""
    return shared_page


def test_the_flows_screen_lists_each_name_at_its_version_and_links_its_runs(page: Page) -> None:
    page.call("POST", "/v1/graphs", 201, params={"name": "page/triage"}, json=GATE)
    current = page.call("POST", "/v1/graphs", 201, params={"name": "page/triage"}, json=EDITED)
    assert current["version"] == 2
    run_id = page.call("POST", "/v1/graph-runs", 201, json={"flow_name": "page/triage"})["run"]
    page.wait_state(run_id, "suspended")

    page.open("#/flows")
    row = '[data-test=flow-row][data-flow="page/triage"]'
    page.find(row, "the flow's row")
    assert page.text_of(f"{row} [data-test=flow-name]") == "page/triage"
    assert page.text_of(f"{row} [data-test=flow-version]") == "2"
    graph = page.driver.execute_script(
        "return document.querySelector(arguments[0]).title", f"{row} [data-test=flow-graph]"
    )
    assert graph == current["graph"]
    page.screenshot("flows")

    # The name leads to the runs started by it.
    page.click(f"{row} [data-test=flow-name]")
    page.find(f'[data-test=run-row][data-run="{run_id}"]', "the run started by the name")
    assert page.driver.current_url.endswith("#/runs?label=salvor.flow%3Apage%2Ftriage")
