"""The replay cursor answers a re-run's calls from the log, in order."""

from __future__ import annotations

import pytest
from salvor.protocol import (
    EventKind,
    NowObserved,
    ReplayCursor,
    ReplayDivergence,
    RunFailed,
)

from .logs import REQUEST, REQUEST_2, S, model, model_done, tool, tool_done, wrap, write

K = EventKind
# seq: 0 RunStarted, 1-2 model, 3 NowObserved, 4-5 tool, 6 model (dangling)
LOG = wrap(
    [
        S,
        model(),
        model_done(1),
        NowObserved(now="2026-08-14T08:00:00Z"),
        tool("lookup", input={"invoice": "A-1", "lines": [1, 2]}),
        tool_done(4),
        model(request_hash=REQUEST_2),
    ]
)


def cursor_at(position: int, log=LOG) -> ReplayCursor:
    cursor = ReplayCursor(log)
    cursor.position = position
    return cursor


def test_a_recorded_model_call_comes_back_with_its_completion() -> None:
    cursor = cursor_at(1)
    recorded = cursor.model_call(REQUEST)
    assert recorded.intent is LOG[1]
    assert recorded.completion is LOG[2]
    assert recorded.seq == 1
    assert cursor.position == 3


def test_a_recorded_tool_call_matches_on_canonical_input() -> None:
    cursor = cursor_at(4)
    # Same JSON value, other key order and number spelling.
    recorded = cursor.tool_call("lookup", {"lines": [1.0, 2], "invoice": "A-1"})
    assert (recorded.intent, recorded.completion) == (LOG[4], LOG[5])
    assert cursor.position == 6


def test_a_dangling_intent_comes_back_without_completion() -> None:
    cursor = cursor_at(6)
    recorded = cursor.model_call(REQUEST_2)
    assert recorded.intent is LOG[6]
    assert recorded.completion is None
    assert cursor.at_end


def test_a_dangling_write_comes_back_without_completion() -> None:
    log = wrap([S, write()])
    cursor = cursor_at(1, log)
    recorded = cursor.tool_call("charge", {"amount": 10})
    assert (recorded.intent, recorded.completion) == (log[1], None)


def test_an_intent_closed_by_a_terminal_event_has_no_completion() -> None:
    log = wrap([S, model(), RunFailed(error="gave up")])
    cursor = cursor_at(1, log)
    recorded = cursor.model_call(REQUEST)
    assert recorded.completion is None
    # The terminal event is left for the driver to read.
    assert cursor.position == 2
    assert cursor.take(K.RUN_FAILED) is log[2]
    assert cursor.at_end


def test_live_at_the_end() -> None:
    cursor = ReplayCursor(LOG)
    cursor.position = len(LOG)
    assert cursor.at_end
    assert cursor.model_call(REQUEST) is None
    assert cursor.tool_call("lookup", {}) is None
    assert cursor.take(K.RUN_COMPLETED) is None
    assert ReplayCursor([]).at_end


def test_a_whole_run_replays_in_order() -> None:
    cursor = ReplayCursor(LOG)
    assert not cursor.at_end
    assert cursor.take(K.RUN_STARTED) is LOG[0]
    assert cursor.model_call(REQUEST).completion is LOG[2]
    assert cursor.take(K.NOW_OBSERVED) is LOG[3]
    assert cursor.tool_call("lookup", {"invoice": "A-1", "lines": [1, 2]}).completion is LOG[5]
    assert cursor.model_call(REQUEST_2).completion is None
    assert cursor.at_end
    assert cursor.model_call("sha256:anything") is None


DIVERGENCES = [
    ("a different request_hash", 1, lambda c: c.model_call(REQUEST_2), "request_hash"),
    (
        "a different tool",
        4,
        lambda c: c.tool_call("refund", {"invoice": "A-1", "lines": [1, 2]}),
        "'refund'",
    ),
    (
        "a different tool input",
        4,
        lambda c: c.tool_call("lookup", {"invoice": "A-2"}),
        '{"invoice":"A-2"}',
    ),
    ("a model call where a tool call is", 4, lambda c: c.model_call(REQUEST), "ToolCallRequested"),
    (
        "a tool call where a model call is",
        1,
        lambda c: c.tool_call("lookup", {}),
        "ModelCallRequested",
    ),
    ("a model call where a clock read is", 3, lambda c: c.model_call(REQUEST), "NowObserved"),
    ("take of another kind", 3, lambda c: c.take(K.RANDOM_OBSERVED), "RandomObserved"),
]


@pytest.mark.parametrize(
    ("position", "call", "needle"),
    [d[1:] for d in DIVERGENCES],
    ids=[d[0] for d in DIVERGENCES],
)
def test_divergence(position: int, call, needle: str) -> None:
    cursor = cursor_at(position)
    with pytest.raises(ReplayDivergence) as caught:
        call(cursor)
    assert (caught.value.code, caught.value.status) == ("divergence", 409)
    assert f"seq {position}" in caught.value.message
    assert needle in caught.value.message
    # The cursor stays at the call it refused.
    assert cursor.position == position
