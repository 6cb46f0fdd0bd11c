"""The page against a daemon with a token: nothing shows before the login, and the token, once
given, is in no URL, no storage and no script-readable cookie; a reload keeps the session (its
CSRF value fetched again) without asking for the token.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By

from tests.daemon.dashboard.page import AGENTS, Page, page_on_a_daemon

TOKEN = "page-token-0f8e5d1c9b7a"

# Every place a page could keep or leak the token, read from inside the page.
WHERE_IT_COULD_BE = """
const storage = (s) => Object.keys(s).map((k) => k + "=" + s.getItem(k)).join("\\n");
return {
  urls: performance.getEntries().map((e) => e.name).concat([location.href]).join("\\n"),
  local: storage(localStorage),
  session: storage(sessionStorage),
  cookie: document.cookie,
  fields: [...document.querySelectorAll("input, textarea")].map((i) => i.value).join("\\n"),
};
"""


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    with page_on_a_daemon(tmp_path_factory.mktemp("login"), token=TOKEN) as opened:
        yield opened


def test_the_page_shows_nothing_before_the_login_and_keeps_the_token_nowhere(page: Page) -> None:
    agent = page.register(AGENTS / "refund-desk.toml")
    body = {"agent": agent, "input": {"invoice_id": "INV-L1"}, "labels": {"who": "hidden"}}
    run_id = page.call("POST", "/v1/runs", 201, json=body)["run"]
    page.wait_state(run_id, "completed")

    page.open("#/runs")
    page.find("[data-test=login-token]", "the login")
    assert page.driver.find_element(By.CSS_SELECTOR, "[data-test=nav]").is_displayed() is False
    shown = page.driver.find_element(By.TAG_NAME, "body").text
    assert run_id[:8] not in shown and "hidden" not in shown
    assert not page.driver.find_elements(By.CSS_SELECTOR, "[data-test=run-row]")
    asked = page.driver.execute_script("return performance.getEntries().map((e) => e.name)")
    assert not [url for url in asked if "/v1/runs" in url or "/v1/ws" in url], asked
    page.screenshot("login")

    # A wrong token: the daemon's refusal, and still nothing else.
    page.find("[data-test=login-token]").send_keys("not-the-token")
    page.driver.find_element(By.CSS_SELECTOR, "[data-test=login-submit]").click()
    page.wait(lambda d: page.text_of("[data-test=login-error]"), "the refusal")
    assert not page.driver.find_elements(By.CSS_SELECTOR, "[data-test=run-row]")

    page.find("[data-test=login-token]").send_keys(TOKEN)
    page.driver.find_element(By.CSS_SELECTOR, "[data-test=login-submit]").click()
    page.find(f'[data-test=run-row][data-run="{run_id}"]', "the runs, after the login")
    # The socket's handshake goes by the cookie too: a run started now shows up live.
    page.wait(lambda d: page.data("[data-test=live-state]", "state") == "live", "the socket")
    later = page.call("POST", "/v1/runs", 201, json=body)["run"]
    page.find(f'[data-test=run-row][data-run="{later}"]', "a run started after the login, live")
    found = page.driver.execute_script(WHERE_IT_COULD_BE)
    assert all(TOKEN not in value for value in found.values()), found
    assert "salvor_session" not in found["cookie"]  # HttpOnly: no script reads it


def test_a_reload_keeps_the_session_and_its_csrf_without_the_token(page: Page) -> None:
    agent = page.register(AGENTS / "ask-operator.toml")
    question = {"question": "Ship it?", "type": "confirm"}
    run_id = page.call("POST", "/v1/runs", 201, json={"agent": agent, "input": question})["run"]
    page.wait_state(run_id, "suspended")

    # A login of its own (this module's tests may run on different workers, each with its own
    # browser): from no session at all to one.
    page.open("#/runs")
    page.driver.delete_all_cookies()
    page.open("#/runs")
    page.find("[data-test=login-token]", "the login").send_keys(TOKEN)
    page.driver.find_element(By.CSS_SELECTOR, "[data-test=login-submit]").click()
    page.wait(
        lambda d: d.find_element(By.CSS_SELECTOR, "[data-test=nav]").is_displayed(),
        "the page, after the login",
    )
    # A fresh load asks for no token.
    page.open(f"#/runs/{run_id}")
    page.find("[data-test=action-abandon]", "the run's actions, without a login").click()
    page.find("[data-test=abandon-reason]").send_keys("asked by mistake")
    page.driver.find_element(By.CSS_SELECTOR, "[data-test=abandon-confirm]").click()
    # A state-changing call by cookie needs the session's CSRF value: the page fetched it back.
    status = page.wait_state(run_id, "abandoned")
    assert status["reason"] == "asked by mistake"
    assert not page.driver.find_elements(By.CSS_SELECTOR, "[data-test=login-token]")
    found = page.driver.execute_script(WHERE_IT_COULD_BE)
    assert all(TOKEN not in value for value in found.values()), found
