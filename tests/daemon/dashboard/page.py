"""What the page's browser tests share: one real ``salvor serve`` and one headless Chromium per
module, an HTTP client beside the browser (to set up runs and check what the page did), and
explicit waits on DOM conditions.

The daemon is a subprocess (``tests.chaos.test_kill_serve.Daemon``: READY=1 over the notify
socket, SIGTERM at the end) with the demo tools and model, and a client-tool declaration (a
payout whose outcome only a person can record), over a SQLite store in the module's temp dir.
Selenium blocks its thread, so the tests are plain functions and talk to the daemon with a
synchronous httpx client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.chaos.test_kill_serve import Daemon
from tests.support.browser import open_browser, require_chromium, screenshot
from tests.support.client_events import run_started

REPO = Path(__file__).resolve().parents[3]
AGENTS = REPO / "contrib" / "agents"
GRAPHS = REPO / "contrib" / "graphs"
WAIT_SECONDS = 15

# A client-performed write the daemon may not let its client complete: an unknown outcome,
# waiting for a person (as in tests/daemon/api/test_reconciliations.py).
PAYOUT = """
name = "payout"
effect = "write"
idempotency_key = ["payout_ref"]
trust_completion = false
[input_schema]
type = "object"
required = ["amount", "payout_ref"]
[output_schema]
type = "object"
required = ["payout_id"]
properties = { payout_id = { type = "string", minLength = 3 } }
"""


@dataclass
class Page:
    """The daemon, the browser on its page, and a client for its API."""

    daemon: Daemon
    driver: WebDriver
    api: httpx.Client
    shots: Path

    @property
    def url(self) -> str:
        return self.daemon.base_url

    def open(self, hash_route: str) -> None:
        """Load the page at ``hash_route``: a fresh document, even when the browser is there
        already (going to the URL it shows would change nothing but the hash)."""
        self.driver.get("about:blank")
        self.driver.get(f"{self.url}/{hash_route}")

    def wait(self, condition: Callable[[WebDriver], Any], what: str, seconds: float = WAIT_SECONDS):
        # The page redraws what changed: an element found a moment ago may have been replaced.
        return WebDriverWait(
            self.driver,
            seconds,
            poll_frequency=0.05,
            ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
        ).until(condition, message=f"{what} (waited {seconds:g} s)")

    def click(self, css: str, what: str | None = None) -> None:
        """Click the first element ``css`` matches, once it is there (again if it was replaced)."""

        def clicked(driver: WebDriver) -> bool:
            found = _first(driver, css)
            if found is None:
                return False
            found.click()
            return True

        self.wait(clicked, what or f"a click on {css}")

    def find(self, css: str, what: str | None = None):
        """The element ``css`` matches, once it is there."""
        return self.wait(lambda d: _first(d, css), what or f"an element {css}")

    def text_of(self, css: str) -> str:
        """The text shown in the first element ``css`` matches, "" when none does (read in the
        page, so an element the page has just replaced is never a stale reference)."""
        return self.driver.execute_script(
            "return document.querySelector(arguments[0])?.innerText ?? ''", css
        )

    def data(self, css: str, name: str) -> str | None:
        """The ``data-<name>`` of the first element ``css`` matches (None when none does)."""
        return self.driver.execute_script(
            "return document.querySelector(arguments[0])?.dataset[arguments[1]] ?? null", css, name
        )

    def screenshot(self, name: str) -> Path:
        return screenshot(self.driver, self.shots, name)

    def call(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        response = self.api.request(method, path, **kwargs)
        assert response.status_code == expect, f"{method} {path}: {response.text}"
        return response.json() if response.content else None

    def register(self, path: Path, content_type: str = "application/toml") -> str:
        response = self.api.post(
            "/v1/agents", content=path.read_bytes(), headers={"Content-Type": content_type}
        )
        assert response.status_code in (200, 201), response.text
        return response.json()["agent"]

    def start_run(self, agent_file: Path, run_input: Any, **fields: Any) -> str:
        body = {"agent": self.register(agent_file), "input": run_input, **fields}
        return self.call("POST", "/v1/runs", 201, json=body)["run"]

    def start_graph_run(self, document: dict, run_input: Any = None) -> str:
        stored = self.api.post("/v1/graphs", json=document)
        assert stored.status_code in (200, 201), stored.text
        body = {"graph_hash": stored.json()["graph"], "input": run_input}
        return self.call("POST", "/v1/graph-runs", 201, json=body)["run"]

    def mark_the_document(self) -> None:
        """A mark on the document shown: still there later means the page was never reloaded."""
        self.driver.execute_script("window.__notReloaded = true")

    def still_the_same_document(self) -> bool:
        return self.driver.execute_script("return window.__notReloaded === true")

    def status(self, run_id: str) -> dict:
        return self.call("GET", f"/v1/runs/{run_id}")["status"]

    def wait_state(self, run_id: str, state: str, seconds: float = WAIT_SECONDS) -> dict:
        """Wait, in the browser's waiter, until the run's API status is ``state``."""
        return self.wait(
            lambda _d: (s := self.status(run_id))["state"] == state and s,
            f"run {run_id} reaching {state}",
            seconds,
        )


def _first(driver: WebDriver, css: str):
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0] if found else None


@contextmanager
def page_on_a_daemon(
    directory: Path,
    *args: str,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
    browser_arguments: Sequence[str] = (),
) -> Iterator[Page]:
    """A daemon started with ``args`` and ``env`` (and ``--auth-token`` when ``token``), and a
    browser (started with ``browser_arguments`` too).

    The two start side by side (each is a second or two of process start), the daemon on a
    thread of its own; it is stopped with SIGTERM at the end and must exit 0."""
    require_chromium()
    payout = directory / "payout.toml"
    payout.write_text(PAYOUT)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    with ThreadPoolExecutor(1, thread_name_prefix="salvor-serve") as starting:
        daemon_started = starting.submit(
            _started, directory, ["--client-tool", str(payout), *args], token, env or {}
        )
        with open_browser(directory / "profile", browser_arguments) as driver:
            daemon = daemon_started.result()
            try:
                with httpx.Client(base_url=daemon.base_url, headers=headers, timeout=30) as api:
                    yield Page(
                        daemon=daemon, driver=driver, api=api, shots=directory / "screenshots"
                    )
                # Whatever the module's tests did, the page never needed what its CSP refuses
                # (an inline script or style, eval, another origin).
                refused = [
                    entry["message"]
                    for entry in driver.get_log("browser")
                    if "Content Security Policy" in entry["message"]
                ]
                assert not refused, refused
            finally:
                code, _ = daemon.terminate()
                assert code == 0, daemon.log()


def log_in(page: Page, token: str) -> None:
    """Log the page's browser in with ``token`` (its daemon was started with it)."""
    page.open("#/runs")
    page.find("[data-test=login-token]", "the login").send_keys(token)
    page.driver.find_element(By.CSS_SELECTOR, "[data-test=login-submit]").click()
    page.wait(
        lambda d: d.find_element(By.CSS_SELECTOR, "[data-test=nav]").is_displayed(),
        "the page, after the login",
    )


def _started(directory: Path, args: list[str], token: str | None, env: Mapping[str, str]) -> Daemon:
    """A started daemon; on a port another process took between its choice and the bind (the
    machine runs other suites), once more on another."""
    for attempt in range(3):
        daemon = Daemon(
            directory, f"sqlite:///{directory / 'salvor.db'}", directory / "effects.jsonl"
        )
        daemon.args += args
        daemon.env.update(env)
        if token is not None:
            daemon.args += ["--auth-token", "SALVOR_PAGE_TOKEN"]
            daemon.env["SALVOR_PAGE_TOKEN"] = token
        try:
            daemon.start()
            return daemon
        except AssertionError as failure:
            if "Address already in use" not in str(failure) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def parked_client_write(page: Page, payout_ref: str) -> str:
    """A client-driven run whose client recorded a payout's intent it may not complete itself:
    the run waits for a person to say what the payout did."""
    opened = page.call("POST", "/v1/client-runs", 201)
    run_id, token = opened["run"], {"X-Drive-Token": opened["drive_token"]}
    head = run_started(run_id, "sha256:" + "c" * 64, {"desk": "payouts"})
    page.call("POST", f"/v1/client-runs/{run_id}/events", headers=token, json={"events": [head]})
    page.call(
        "POST",
        f"/v1/client-runs/{run_id}/client-tool-intent",
        headers=token,
        json={"seq": 1, "tool": "payout", "input": {"amount": 70, "payout_ref": payout_ref}},
    )
    return run_id
