"""The API reference at ``/docs`` in a real browser, against a real daemon: drawn from the
document the daemon serves, grouped, with anchors; the document's own text shown as text (its
``<seq>`` and ``<Envelope>`` never become elements); behind the page's login when the daemon has a
token, open when it has none.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon.dashboard.page import Page, page_on_a_daemon

TOKEN = "reference-token-3c1d9e"
START_RUN = '[data-test=operation][data-method=post][data-path="/v1/runs"]'


@pytest.fixture(scope="module")
def guarded_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    with page_on_a_daemon(tmp_path_factory.mktemp("reference"), token=TOKEN) as opened:
        yield opened


def _operations(page: Page) -> list[tuple[str, str]]:
    return page.driver.execute_script(
        "return [...document.querySelectorAll('[data-test=operation]')]"
        ".map((o) => [o.dataset.method, o.dataset.path])"
    )


def _assert_the_reference_is_drawn(page: Page) -> None:
    page.find(START_RUN, "POST /v1/runs in the reference")
    document = page.call("GET", "/v1/openapi.json")
    expected = sorted((m, p) for p, item in document["paths"].items() for m in item)
    assert sorted(map(tuple, _operations(page))) == expected
    groups = page.driver.execute_script(
        "return [...document.querySelectorAll('[data-test=group] > h2')].map((h) => h.id || "
        "h.parentElement.id)"
    )
    assert groups[:3] == ["tag-agents", "tag-graphs", "tag-runs"], groups

    start = page.text_of(START_RUN)
    assert document["paths"]["/v1/runs"]["post"]["summary"] in start
    assert "StartRun" in page.text_of(f"{START_RUN} [data-test=request-body]")
    codes = page.driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' [data-test=response]')]"
        ".map((r) => [r.dataset.status, [...r.querySelectorAll('[data-test=error-code]')]"
        ".map((c) => c.textContent)])",
        START_RUN,
    )
    by_status = dict(codes)
    assert sorted(by_status["404"]) == ["unknown_agent", "unknown_run"], by_status
    assert sorted(by_status["409"]) == ["port_held", "run_exists", "wrong_state"], by_status
    assert by_status["403"] == ["forbidden"] and "201" in by_status

    # The list's query parameters, and the shared schemas a link leads to.
    listing = '[data-test=operation][data-method=get][data-path="/v1/runs"]'
    names = page.driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' [data-test=parameter] code')]"
        ".map((c) => c.textContent)",
        listing,
    )
    assert {"status", "label", "limit", "cursor"} <= set(names), names
    page.find("#schema-RunSummary", "the RunSummary schema's own section")

    # Text from the document stays text: the stream's frames are described as `data: <Envelope>`.
    events = '[data-test=operation][data-path="/v1/runs/{run_id}/events"]'
    assert "data: <Envelope>" in page.text_of(events)
    injected = page.driver.execute_script(
        "return document.querySelectorAll('seq, envelope, endframe').length"
    )
    assert injected == 0

    # The contents link to each operation's anchor.
    page.click('[data-test=toc-link][href="#getRun"]', "the contents' link to GET /v1/runs/{id}")
    page.wait(lambda d: d.execute_script("return location.hash") == "#getRun", "the anchor")
    assert page.data("#getRun", "path") == "/v1/runs/{run_id}"


def test_the_reference_asks_for_the_login_first_and_then_draws_every_route(
    guarded_page: Page,
) -> None:
    page = guarded_page
    page.open("docs")
    page.find("[data-test=login-token]", "the login")
    assert _operations(page) == []
    asked = page.driver.execute_script("return performance.getEntries().map((e) => e.name)")
    assert all(not url.startswith(("http://", "https://")) or page.url in url for url in asked)

    page.find("[data-test=login-token]").send_keys(TOKEN)
    page.click("[data-test=login-submit]")
    _assert_the_reference_is_drawn(page)
    page.driver.execute_script("window.scrollTo(0, 0)")
    page.screenshot("reference")


def test_the_reference_is_open_on_a_daemon_without_a_token_and_deep_links_work(
    shared_page: Page,
) -> None:
    page = shared_page
    page.open("docs#streamRunEvents")
    page.find("#streamRunEvents", "the stream's operation")
    assert page.driver.execute_script("return location.hash") == "#streamRunEvents"
    assert not page.driver.find_elements("css selector", "[data-test=login-token]")
    _assert_the_reference_is_drawn(page)
