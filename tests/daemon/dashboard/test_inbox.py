"""The inbox in a real browser against a real daemon: a gate answered through its form (a wrong
value refused with the API's own message first), a question, an unknown write resolved with its
output, a budget extended, and every kind of wait listed at once.

The daemon (demo model and tools, a client-tool declaration, no token) and the headless Chromium
are the package's (conftest.py). Each test sets its runs up over the API, then drives the page as
a person would, waiting on DOM conditions; what the page did is checked over the API.
"""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.by import By

from tests.daemon.dashboard.page import (
    AGENTS,
    REPO,
    Page,
    parked_client_write,
)

# A gate whose approval names a ticket: a person can type a wrong one.
TICKET_GATE = {
    "schema_version": 1,
    "nodes": [
        {
            "id": "close",
            "kind": "gate",
            "name": "Close the ticket",
            "prompt": "Which ticket does this close?",
            "approval_schema": {
                "type": "object",
                "required": ["ticket"],
                "properties": {"ticket": {"type": "string", "pattern": "^T-[0-9]+$"}},
            },
        }
    ],
    "edges": [],
}


@pytest.fixture
def page(shared_page: Page) -> Page:
    """The package's daemon and browser (conftest.py)."""
    return shared_page


def test_a_gate_form_refuses_a_wrong_value_with_the_apis_message_then_completes(
    page: Page,
) -> None:
    run_id = page.start_graph_run(TICKET_GATE)
    page.wait_state(run_id, "suspended")
    # What the API says of the wrong value, asked directly (a refused resume records nothing).
    refused = page.api.post(f"/v1/runs/{run_id}/resume", json={"input": {"ticket": "closed"}})
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]

    page.open("#/inbox")
    card = f'[data-test=inbox-item][data-run="{run_id}"]'
    page.find(f"{card}[data-kind=gate]", "the gate's card")
    assert "Which ticket does this close?" in page.text_of(card)
    field = page.find(f'{card} [data-field="/ticket"] [data-test=input]')
    field.send_keys("closed")
    page.driver.find_element(By.CSS_SELECTOR, f"{card} [data-test=answer-submit]").click()
    page.wait(
        lambda d: page.text_of(f"{card} [data-test=form-error]") == message,
        "the API's message beside the form",
    )
    assert page.status(run_id)["state"] == "suspended"
    page.screenshot("gate")

    field.clear()
    field.send_keys("T-42")
    page.driver.find_element(By.CSS_SELECTOR, f"{card} [data-test=answer-submit]").click()
    page.wait_state(run_id, "completed")
    page.wait(lambda d: not d.find_elements(By.CSS_SELECTOR, card), "the card leaving the inbox")


def test_an_unknown_write_is_resolved_from_the_inbox(page: Page) -> None:
    run_id = parked_client_write(page, "po-page-1")
    # The run's own page shows the write as its pending call, and the same card.
    page.open(f"#/runs/{run_id}")
    page.find("[data-test=run-waiting] [data-test=inbox-item][data-kind=unknown_write]")
    pending = page.text_of("[data-test=pending]")
    assert pending.startswith("payout (write, key sha256:") and pending.endswith("at seq 1")
    page.open("#/inbox")
    card = f'[data-test=inbox-item][data-run="{run_id}"]'
    page.find(f"{card}[data-kind=unknown_write]", "the unknown write's card")
    assert page.text_of(f"{card} [data-test=write-tool]") == "payout"
    assert "po-page-1" in page.text_of(f"{card} [data-test=write-intent]")
    # The declaration's output schema is the form: too short an id is the API's refusal.
    field = page.find(f'{card} [data-field="/payout_id"] [data-test=input]')
    field.send_keys("p1")
    page.driver.find_element(By.CSS_SELECTOR, f"{card} [data-test=resolve-submit]").click()
    page.wait(lambda d: page.text_of(f"{card} [data-test=form-error]"), "the refusal")
    assert page.call("GET", "/v1/reconciliations")["reconciliations"][0]["run"] == run_id

    field.clear()
    field.send_keys("pay-9001")
    page.driver.find_element(By.CSS_SELECTOR, f"{card} [data-test=resolve-submit]").click()
    page.wait(lambda d: page.text_of(f"{card} [data-test=action-done]") == "Resolved.", "resolved")
    queue = page.call("GET", "/v1/reconciliations")["reconciliations"]
    assert run_id not in [item["run"] for item in queue]
    log = page.call("GET", f"/v1/client-runs/{run_id}/log")
    completion = log["log"][-1]["event"]
    assert completion["kind"] == "ToolCallCompleted"
    assert completion["payload"]["output"] == {"payout_id": "pay-9001"}
    assert completion["payload"]["settled_by"] == "operator"


def test_a_budget_crossing_is_extended_from_the_inbox(page: Page, tmp_path) -> None:
    agent = tmp_path / "refund-desk-short.toml"
    agent.write_text((AGENTS / "refund-desk.toml").read_text().replace("steps = 12", "steps = 1"))
    run_id = page.start_run(agent, {"invoice_id": "INV-B1"})
    crossed = page.wait_state(run_id, "budget_exceeded")
    assert crossed["budget"] == {"kind": "steps", "limit": 1}

    page.open("#/inbox")
    card = f'[data-test=inbox-item][data-run="{run_id}"]'
    page.find(f"{card}[data-kind=budget]", "the budget's card")
    assert "steps budget of 1" in page.text_of(f"{card} [data-test=wait-reason]")
    page.find(f"{card} [data-test=extend-by]").send_keys("20")
    page.driver.find_element(By.CSS_SELECTOR, f"{card} [data-test=extend-submit]").click()
    page.wait_state(run_id, "completed")
    log_kinds = [e["event"]["kind"] for e in _log(page, run_id)]
    assert log_kinds.count("BudgetExceeded") == 1 and "Resumed" in log_kinds


def test_a_question_is_answered_from_its_options(page: Page) -> None:
    question = {"question": "Which rollout?", "type": "select", "options": ["blue", "rolling"]}
    run_id = page.start_run(AGENTS / "ask-operator.toml", question)
    page.wait_state(run_id, "suspended")
    page.open("#/inbox")
    card = f'[data-test=inbox-item][data-run="{run_id}"]'
    page.find(f"{card}[data-kind=question]", "the question's card")
    assert page.text_of(f"{card} [data-test=wait-reason]") == "Which rollout?"
    select = page.find(f'{card} [data-field="/answer"] select')
    select.find_element(By.CSS_SELECTOR, "option:nth-child(3)").click()
    page.driver.find_element(By.CSS_SELECTOR, f"{card} [data-test=answer-submit]").click()
    page.wait_state(run_id, "completed")
    resumed = [e for e in _log(page, run_id) if e["event"]["kind"] == "Resumed"]
    assert [e["event"]["payload"]["input"] for e in resumed] == [{"answer": "rolling"}]


def test_the_inbox_lists_every_wait_on_a_person_and_no_signal_wait(page: Page, tmp_path) -> None:
    short = tmp_path / "refund-desk-short.toml"
    short.write_text((AGENTS / "refund-desk.toml").read_text().replace("steps = 12", "steps = 1"))
    approval = REPO / "contrib/curl/refund-with-approval.toml"
    waits = {
        page.start_run(approval, {"invoice_id": "INV-W1"}): "gate",
        page.start_run(
            AGENTS / "ask-operator.toml",
            {"question": "Ship on Friday?", "type": "confirm"},
        ): "question",
        parked_client_write(page, "po-overview"): "unknown_write",
        page.start_run(short, {"invoice_id": "INV-W2"}): "budget",
    }
    # A wait for an external system (a signal) is nobody's task.
    signal = page.start_run(approval, {"invoice_id": "INV-W3", "signal": True})
    for run_id, kind in waits.items():
        if kind != "unknown_write":
            page.wait_state(run_id, "budget_exceeded" if kind == "budget" else "suspended")
    assert page.wait_state(signal, "suspended")["kind"] == "signal"

    page.open("#/inbox")
    for run_id, kind in waits.items():
        page.find(f'[data-test=inbox-item][data-run="{run_id}"][data-kind={kind}]', kind)
    shown = page.driver.execute_script(
        "return [...document.querySelectorAll('[data-test=inbox-item]')].map(e => e.dataset.run)"
    )
    # (Other tests on this daemon may leave runs waiting too.)
    assert set(waits) <= set(shown) and signal not in shown
    page.wait(lambda d: page.text_of("[data-test=inbox-count]") == str(len(shown)), "the count")
    page.screenshot("inbox")


def _log(page: Page, run_id: str) -> list[dict]:
    """The run's recorded envelopes, read from its SSE stream to its end frame."""
    events = []
    with page.api.stream("GET", f"/v1/runs/{run_id}/events") as stream:
        for line in stream.iter_lines():
            if line.startswith("data: ") and '"seq"' in line:
                events.append(json.loads(line[len("data: ") :]))
    return events
