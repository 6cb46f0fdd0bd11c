"""The long composed chaos run, for a person to start: the workload and invariants of
``test_kill_composed`` for as many kills as asked, one JSON line on stdout.

    python -m tests.chaos.composed_chaos --kills 500
    python -m tests.chaos.composed_chaos --kills 200 --store postgresql://user@127.0.0.1/db
    python -m tests.chaos.composed_chaos --disk-full-cycles 100

``--disk-full-cycles N`` runs no kills: the SQLite store lives on a tmpfs of its own (root only),
filled and freed N times under the load while one daemon, never restarted, heals what each cycle
stopped.

Everything listens on 127.0.0.1 (the daemon, the scripted provider). A SQLite store is a file
in a new temporary directory; a PostgreSQL URL gets a schema of its own, dropped at the end (the
database's other schemas are not touched). ``--max-seconds`` bounds the kills' part of the run
(the report says how many landed); the end adds at most a few minutes of settling. The line
holds kills, runs, violations (empty when none), runs_needing_a_hand, seconds and seed; the exit
status is 0 exactly when both lists are empty. The daemon's logs stay in the temporary
directory, named on stderr, when anything was found.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.test_kill_composed import Composed, run_composed, run_disk_full_cycles
from tests.conftest import _postgres_schema_url
from tests.support.disk import Filler, TmpfsRefused, tmpfs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.composed_chaos")
    parser.add_argument("--kills", type=int, default=500, help="SIGKILLs to deliver")
    parser.add_argument("--store", help="a postgresql:// URL (default: a new SQLite file)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--max-seconds", type=float, default=6 * 3600.0)
    parser.add_argument(
        "--disk-full-cycles", type=int, metavar="N", help="fill and free the disk N times instead"
    )
    args = parser.parse_args(argv)
    if args.store and not args.store.startswith("postgresql"):
        parser.error("--store takes a postgresql:// URL (SQLite is the default)")
    if args.store and args.disk_full_cycles:
        parser.error("--disk-full-cycles fills a SQLite store's disk; leave out --store")
    work = Path(tempfile.mkdtemp(prefix="salvor-composed-chaos-"))
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        store_url = f"sqlite:///{work / 'salvor.db'}"
        disk = None
        if args.disk_full_cycles:
            try:
                disk = Filler(stack.enter_context(tmpfs(work / "disk", "512m")))
            except TmpfsRefused as refused:
                parser.error(str(refused))
            store_url = f"sqlite:///{disk.store_dir / 'salvor.db'}"
        if args.store:
            store_url = stack.enter_context(
                contextlib.contextmanager(_postgres_schema_url)(args.store)
            )
        harness = Composed(work, store_url, args.seed)
        stack.callback(harness.close)
        try:
            if disk is not None:
                run_disk_full_cycles(
                    harness, disk, cycles=args.disk_full_cycles, seconds=args.max_seconds
                )
            else:
                run_composed(harness, [], kills=args.kills, seconds=args.max_seconds)
        except AssertionError as exc:  # the daemon would not start, or the API refused
            harness.violations.append(f"{harness.stop_named}: the run stopped: {exc}")
    figures = harness.figures(began)
    print(json.dumps(figures), flush=True)
    clean = not figures["violations"] and not figures["runs_needing_a_hand"]
    if clean:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"daemon logs and ledger kept in {work}", file=sys.stderr)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
