"""No request stalls the daemon: while each attack payload of issue 29 is in flight, a second
client's ``/v1/health`` is answered.

A real ``salvor serve`` process, a prober thread asking ``/v1/health`` back to back, and one
payload from ``tests/bench/bench_stall.py`` (which prints the p99 of the same probes; the target
there is 100 ms). The bound here is generous, 2 s for the slowest probe, so a loaded machine does
not fail it; before these payloads were bounded and parsed off the event loop, the slowest probe
waited for the whole payload: 6 to 23 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.bench.bench_recover import ServeProcess
from tests.bench.bench_stall import PAYLOADS, under_payload

# The slowest health probe allowed while a payload is in flight.
PROBE_BOUND_SECONDS = 2.0

# Each payload that stalled every request before (the bench has more), and the status it is
# answered with.
EXPECTED = {
    "markdown_7mib": 413,
    "pattern": 400,
    "enum_300k": 200,
}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[str]:
    serve = ServeProcess("sqlite:///" + str(tmp_path / "salvor.db"), tmp_path)
    serve.start()
    try:
        yield serve.base_url
    finally:
        assert serve.stop() == 0, serve.log()


@pytest.mark.parametrize("name", EXPECTED)
def test_health_is_answered_while_a_payload_is_in_flight(daemon: str, name: str) -> None:
    with httpx.Client(base_url=daemon, timeout=60) as client:
        send = PAYLOADS[name](client)
    latencies, response, _ = under_payload(daemon, send)
    assert latencies, "no probe overlapped the payload"
    assert max(latencies) < PROBE_BOUND_SECONDS, (
        f"/v1/health waited {max(latencies):.1f}s while {name} was in flight"
    )
    # Each is refused (an invalid graph is a 200 that says so), and fast.
    assert response.status_code == EXPECTED[name], response.text
    assert "error" in response.json() or response.json().get("valid") is False
