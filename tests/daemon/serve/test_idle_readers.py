"""Readers that never read cost a real daemon about a page each, however long the run's log.

A ``salvor serve`` subprocess serves a completed run of 24 MiB of events (written straight into
the store). Ten event streams and ten WebSockets ask for all of it and then read nothing, with
the smallest receive buffer the kernel allows. The daemon's resident memory (``VmRSS`` of
``/proc/<pid>/status``, once it has stopped moving) may grow by a few MiB per reader, never by
the log: before the catch-up was paged and the buffers weighed in bytes, each stream held the
whole log three times over (decoded, framed, joined into one chunk) and each WebSocket once (its
outbox, bounded by count), so these twenty readers took well over a GiB. The bounds are generous
(a loaded machine, the allocator's own slack); the figures themselves are
``tests/bench/bench_idle_readers.py``'s.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.idle_readers import (
    MIB,
    IdleDaemon,
    idle_readers,
    settled_rss_kib,
    status_kib,
    write_large_run,
)
from tests.support.ports import free_port
from tests.support.spawn import run_salvor

LOG_BYTES = 24 * MIB
READERS = 10
# Growth allowed for each kind of reader, all ten together, and for the peak over the whole test.
GROWTH_MIB = 64
PEAK_MIB = 150


def test_idle_readers_of_a_large_run_hold_about_a_page_each(store_url, tmp_path) -> None:
    run_id = write_large_run(store_url, LOG_BYTES)
    daemon = IdleDaemon(store_url, free_port(), tmp_path / "serve.log")
    try:
        base = f"http://127.0.0.1:{daemon.port}"
        # One reader that reads it all first: what any whole read costs once is in the baseline.
        with httpx.stream("GET", f"{base}/v1/runs/{run_id}/events", timeout=60) as response:
            assert response.status_code == 200
            received, tail = 0, b""
            for chunk in response.iter_bytes():
                received, tail = received + len(chunk), (tail + chunk)[-4096:]
        assert received > LOG_BYTES * 0.9 and b"event: end" in tail, (received, tail[-200:])
        before = settled_rss_kib(daemon.pid)
        with idle_readers(daemon.port, run_id, sse=READERS, ws=0):
            with_streams = settled_rss_kib(daemon.pid)
            with idle_readers(daemon.port, run_id, sse=0, ws=READERS):
                with_sockets = settled_rss_kib(daemon.pid)
                # Still serving: the idle readers hold nothing another client waits on.
                health = httpx.get(f"{base}/v1/health", timeout=30)
                assert health.status_code == 200
        peak = status_kib(daemon.pid, "VmHWM")
    finally:
        daemon.stop()
    figures = {
        "before_mib": before / 1024,
        "streams_growth_mib": (with_streams - before) / 1024,
        "websockets_growth_mib": (with_sockets - with_streams) / 1024,
        "peak_growth_mib": (peak - before) / 1024,
    }
    assert figures["streams_growth_mib"] < GROWTH_MIB, figures
    assert figures["websockets_growth_mib"] < GROWTH_MIB, figures
    assert figures["peak_growth_mib"] < PEAK_MIB, figures


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_streaming_flags_reach_the_daemon_and_bad_values_are_usage_errors(
    store_url, tmp_path
) -> None:
    for flag, value in (("--stream-buffer-bytes", "4096"), ("--max-streams-per-client", "many")):
        refused = run_salvor(
            ["serve", "--store", store_url, flag, value], capture_output=True, text=True, timeout=60
        )
        assert refused.returncode == 2 and flag in refused.stderr, refused.stderr
    run_id = write_large_run(store_url, 2 * MIB)
    daemon = IdleDaemon(
        store_url,
        free_port(),
        tmp_path / "serve.log",
        "--max-streams-per-client",
        "2",
        "--stream-buffer-bytes",
        "65536",
    )
    try:
        events = f"http://127.0.0.1:{daemon.port}/v1/runs/{run_id}/events"
        with idle_readers(daemon.port, run_id, sse=1, ws=1):
            refused = httpx.get(events, timeout=30)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "too_many_requests"
            assert refused.headers["Retry-After"] == "5"
        # Both readers gone (once the daemon has seen them go), a stream opens again.
        deadline = time.monotonic() + 30
        while (status := httpx.get(events, timeout=30).status_code) == 429:
            assert time.monotonic() < deadline, "the closed readers' places never came free"
            time.sleep(0.05)
        assert status == 200
    finally:
        daemon.stop()
