"""One daemon and one browser for the page's tests without a token (test_live, test_inbox,
test_run_page): each costs seconds of process start, and the tests find their own runs by id, so
they share them. The daemon takes process agents over HTTP, their model calls answered by the
scripted provider (a re-run reproduces a process agent's run)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon.dashboard.page import Page, page_on_a_daemon
from tests.support.scripted_provider import ScriptedProvider, text_reply


@pytest.fixture(scope="package")
def shared_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    with ScriptedProvider(lambda call: text_reply("stamped")) as provider:
        upstream = {"SALVOR_AGENT_UPSTREAM": provider.base_url, "SALVOR_AGENT_KEY": "page-key"}
        with page_on_a_daemon(
            tmp_path_factory.mktemp("page"), "--allow-process-agents", env=upstream
        ) as opened:
            yield opened
