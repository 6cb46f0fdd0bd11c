"""One daemon and one browser for the page's tests without a token (test_live, test_inbox,
test_run_page): each costs seconds of process start, and the tests find their own runs by id, so
they share them. It takes no process agents (a daemon that runs programs listens on TCP only with
a token): the re-run test has a daemon of its own, with a token (test_run_page)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon.dashboard.page import Page, page_on_a_daemon


@pytest.fixture(scope="package")
def shared_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    with page_on_a_daemon(tmp_path_factory.mktemp("page")) as opened:
        yield opened
