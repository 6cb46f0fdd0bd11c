"""The daemon's instruments without a daemon: one registry each, bounded labels, the scrape-time
families from the readings a scraper hands in."""

from __future__ import annotations

import prometheus_client
import trio
from prometheus_client.parser import text_string_to_metric_families
from salvor.daemon.metrics import DaemonMetrics, Readings, counting_into, current_metrics
from salvor.protocol import RunState


def samples(metrics: DaemonMetrics, readings: Readings | None = None) -> dict[tuple, float]:
    text = metrics.exposition(readings or Readings()).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_two_daemons_keep_their_counts_apart_and_off_the_global_registry() -> None:
    one, two = DaemonMetrics(), DaemonMetrics()
    one.observe_commit(5, 0.002)
    assert samples(one)[("salvor_appends_total", ())] == 5
    assert samples(two)[("salvor_appends_total", ())] == 0
    assert not any(
        name.startswith("salvor_") for name in prometheus_client.REGISTRY._names_to_collectors
    )


def test_a_commit_counts_its_events_once_and_its_seconds_in_the_histograms() -> None:
    metrics = DaemonMetrics()
    metrics.observe_commit(3, 0.004)
    metrics.observe_commit(1, 0.0004)
    scraped = samples(metrics)
    assert scraped[("salvor_appends_total", ())] == 4
    assert scraped[("salvor_commits_total", ())] == 2
    assert scraped[("salvor_group_commit_events_count", ())] == 2
    assert scraped[("salvor_group_commit_events_sum", ())] == 4
    assert scraped[("salvor_group_commit_events_bucket", (("le", "2.0"),))] == 1
    assert scraped[("salvor_commit_seconds_bucket", (("le", "0.0005"),))] == 1
    assert scraped[("salvor_commit_seconds_sum", ())] == 0.0044


def test_the_readings_become_every_state_and_transport_and_nothing_else() -> None:
    metrics = DaemonMetrics()
    readings = Readings(
        runs_by_state={"completed": 4, "needs_reconciliation": 2, "no-such-state": 9},
        claims_held=3,
        drivers_live=1,
        stream_subscribers={"sse": 7},
    )
    scraped = samples(metrics, readings)
    runs = {
        labels[0][1]: value for (name, labels), value in scraped.items() if name == "salvor_runs"
    }
    # Every state shows (at 0 when none is in it); a stored string no state is never a label.
    assert runs == {state.value: 0 for state in RunState} | {
        "completed": 4,
        "needs_reconciliation": 2,
    }
    assert scraped[("salvor_reconciliations_open", ())] == 2
    assert scraped[("salvor_claims_held", ())] == 3
    assert scraped[("salvor_drivers_live", ())] == 1
    assert scraped[("salvor_stream_subscribers", (("transport", "sse"),))] == 7
    assert scraped[("salvor_stream_subscribers", (("transport", "ws"),))] == 0
    # The readings were this scrape's: the next one without them shows no stale values.
    assert ("salvor_drivers_live", ()) not in samples_without_readings(metrics)


def samples_without_readings(metrics: DaemonMetrics) -> dict[tuple, float]:
    text = prometheus_client.generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_wire_or_transport_nobody_named_is_never_a_label() -> None:
    metrics = DaemonMetrics()
    metrics.proxy_wires(frozenset({"openai.chat"}))
    metrics.observe_proxy_call("openai.chat", 0.2)
    metrics.observe_proxy_call("../../etc/passwd", 0.2)
    metrics.observe_mcp_call("stdio", 1.5)
    metrics.observe_mcp_call("carrier-pigeon", 1.5)
    scraped = samples(metrics)
    wires = {labels for (name, labels) in scraped if name == "salvor_proxy_call_seconds_count"}
    assert wires == {(("wire", "openai.chat"),)}
    assert scraped[("salvor_proxy_call_seconds_count", (("wire", "openai.chat"),))] == 1
    transports = {
        labels: value
        for (name, labels), value in scraped.items()
        if name == "salvor_mcp_call_seconds_count"
    }
    assert transports == {(("transport", "stdio"),): 1, (("transport", "http"),): 0}


async def test_the_current_instruments_are_a_task_trees_own() -> None:
    one, two = DaemonMetrics(), DaemonMetrics()
    seen: dict[str, DaemonMetrics | None] = {}

    async def daemon(name: str, metrics: DaemonMetrics) -> None:
        counting_into(metrics)
        await trio.lowlevel.checkpoint()

        async def deep() -> None:
            seen[name] = current_metrics()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deep)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(daemon, "one", one)
        nursery.start_soon(daemon, "two", two)
    assert seen == {"one": one, "two": two}
    assert current_metrics() is None
