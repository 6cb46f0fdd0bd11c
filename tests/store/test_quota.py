"""The store's run quota: a run's event count, its bytes and any one payload are bounded, the
refusal names the limit, nothing over it is written, and the run's ending always fits.

The bytes a run holds are counted from the store itself by a second store object (a restart, or
another process over the same store), not only remembered by the one that wrote them.
"""

from __future__ import annotations

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    NowObserved,
    RunAbandoned,
    RunFailed,
    RunStarted,
    Suspended,
)
from salvor.store import (
    AppendRequest,
    EventStore,
    PayloadTooLarge,
    QuotaExceeded,
    RunQuota,
)

RUN = "5b0c8f0e-2a7c-4d8e-9c1f-3e6a1b2c4d5e"


def head(text: str = "") -> RunStarted:
    return RunStarted(agent_def_hash="sha256:agent", input={"task": text})


def filled(store: EventStore, events: int, size: int):
    """A run of a head and ``events`` - 1 observations, each about ``size`` bytes of input."""
    _, view = store.append(RUN, [head("x" * size)], EMPTY_VIEW)
    for _ in range(events - 1):
        _, view = store.append(RUN, [NowObserved(now="2026-01-01T00:00:00.000000Z")], view)
    return view


def test_a_run_is_refused_past_its_event_limit_and_its_failure_still_fits(store_url) -> None:
    with EventStore.open(store_url, quota=RunQuota(max_run_events=5)) as store:
        view = filled(store, 5, 10)
        with pytest.raises(QuotaExceeded) as refused:
            store.append(RUN, [NowObserved(now="2026-01-01T00:00:00.000000Z")], view)
        assert refused.value.status == 413
        assert "limit of 5 per run (salvor serve --max-run-events)" in refused.value.message
        assert refused.value.details["limit"] == "max_run_events"
        assert store.read_view(RUN).next_seq == 5
        # The ending is taken within the margin: one event past the limit.
        _, ended = store.append(RUN, [RunFailed(error=refused.value.message)], view)
        assert ended.state.value == "failed" and ended.next_seq == 6


def test_a_run_is_refused_past_its_byte_limit_counted_from_the_store(store_url) -> None:
    quota = RunQuota(max_run_bytes=4000)
    with EventStore.open(store_url, quota=quota) as store:
        view = filled(store, 1, 3000)
    big = Suspended(reason="y" * 1200, input_schema={"type": "object"})
    # Another store object (a restart, another process) counts the run's bytes from its rows.
    with EventStore.open(store_url, quota=quota) as store:
        results = store.append_batch([AppendRequest(run_id=RUN, events=[big], view=view)])
        assert isinstance(results[0], QuotaExceeded), results
        assert "limit of 4000 bytes per run (salvor serve --max-run-bytes)" in results[0].message
        assert results[0].details["limit"] == "max_run_bytes"
        assert store.read_view(RUN).next_seq == 1
        # Under the limit, the same kind of event is taken.
        _, view = store.append(RUN, [Suspended(reason="z", input_schema={"type": "object"})], view)
        # An abandon always fits.
        _, ended = store.append(RUN, [RunAbandoned(reason="full " * 100)], view)
        assert ended.state.value == "abandoned"


def test_one_payload_over_its_limit_is_refused_whatever_the_run_holds(store_url) -> None:
    with EventStore.open(store_url, quota=RunQuota(max_payload_bytes=2048)) as store:
        with pytest.raises(PayloadTooLarge) as refused:
            store.append(RUN, [head("é" * 1500)], EMPTY_VIEW)  # 3000 bytes in UTF-8
        assert refused.value.status == 413
        assert "(salvor serve --max-payload-bytes)" in refused.value.message
        assert store.read_view(RUN) is None
        store.append(RUN, [head("é" * 900)], EMPTY_VIEW)


def test_a_run_over_lowered_limits_can_still_end(store_url) -> None:
    with EventStore.open(store_url, quota=RunQuota()) as store:
        view = filled(store, 10, 5000)
    with EventStore.open(store_url, quota=RunQuota(max_run_events=3, max_run_bytes=100)) as store:
        with pytest.raises(QuotaExceeded):
            store.append(RUN, [NowObserved(now="2026-01-01T00:00:00.000000Z")], view)
        _, ended = store.append(RUN, [RunFailed(error="over the lowered limits")], view)
        assert ended.state.value == "failed"
