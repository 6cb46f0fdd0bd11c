"""Benchmark: what idle readers of a large run make ``salvor serve`` hold (issue 29's figures).

A completed run of ``--log-mib`` MiB of events is written straight into the store; then a
``salvor serve`` subprocess serves it to ``--readers`` event streams, and then to as many
WebSockets besides, each of which asks for the whole log and reads nothing (a 4 KiB receive
buffer). Prints one JSON object: the daemon's VmRSS before, with the streams, with the
WebSockets too (each once it stopped moving), and its peak (VmHWM), in MiB. Before paged
catch-ups and byte-bounded buffers, ten streams of a 90 MiB run took the daemon from 200 MiB to
3.3 GiB, and ten WebSockets to 1.29 GiB. Never a timed assertion
(``tests/daemon/serve/test_idle_readers.py`` holds the bounds).

    python tests/bench/bench_idle_readers.py [--log-mib 90] [--readers 10] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx

from tests.support.idle_readers import (
    MIB,
    IdleDaemon,
    idle_readers,
    settled_rss_kib,
    status_kib,
    write_large_run,
)
from tests.support.ports import free_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-mib", type=int, default=90)
    parser.add_argument("--readers", type=int, default=10)
    parser.add_argument("--store", help="a store URL (default: a SQLite file in a scratch dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="salvor-bench-idle-") as scratch:
        store_url = args.store or f"sqlite:///{Path(scratch) / 'salvor.db'}"
        began = time.monotonic()
        run_id = write_large_run(store_url, args.log_mib * MIB)
        written = time.monotonic() - began
        daemon = IdleDaemon(store_url, free_port(), Path(scratch) / "serve.log")
        try:
            url = f"http://127.0.0.1:{daemon.port}/v1/runs/{run_id}/events"
            with httpx.stream("GET", url, timeout=600) as response:
                for _ in response.iter_bytes():
                    pass
            before = settled_rss_kib(daemon.pid)
            with idle_readers(daemon.port, run_id, sse=args.readers, ws=0):
                streams = settled_rss_kib(daemon.pid)
                with idle_readers(daemon.port, run_id, sse=0, ws=args.readers):
                    sockets = settled_rss_kib(daemon.pid)
            peak = status_kib(daemon.pid, "VmHWM")
        finally:
            daemon.stop()
    print(
        json.dumps(
            {
                "log_mib": args.log_mib,
                "readers": args.readers,
                "write_seconds": round(written, 2),
                "rss_before_mib": round(before / 1024, 1),
                "rss_with_streams_mib": round(streams / 1024, 1),
                "rss_with_streams_and_websockets_mib": round(sockets / 1024, 1),
                "rss_peak_mib": round(peak / 1024, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
