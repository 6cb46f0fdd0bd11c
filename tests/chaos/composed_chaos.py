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

import sys

from tests.chaos.long_run import chaos_arguments, chaos_parser, run_long
from tests.chaos.test_kill_composed import Composed, run_composed, run_disk_full_cycles
from tests.support.disk import Filler, TmpfsRefused, tmpfs


def main(argv: list[str] | None = None) -> int:
    parser = chaos_parser("python -m tests.chaos.composed_chaos")
    parser.add_argument("--kills", type=int, default=500, help="SIGKILLs to deliver")
    parser.add_argument(
        "--disk-full-cycles", type=int, metavar="N", help="fill and free the disk N times instead"
    )
    args = chaos_arguments(parser, argv)
    if args.store and args.disk_full_cycles:
        parser.error("--disk-full-cycles fills a SQLite store's disk; leave out --store")

    def build(work, store_url, stack):
        if not args.disk_full_cycles:
            harness = Composed(work, store_url, args.seed)
            return harness, lambda: run_composed(
                harness, [], kills=args.kills, seconds=args.max_seconds
            )
        try:
            disk = Filler(stack.enter_context(tmpfs(work / "disk", "512m")))
        except TmpfsRefused as refused:
            parser.error(str(refused))
        harness = Composed(work, f"sqlite:///{disk.store_dir / 'salvor.db'}", args.seed)
        return harness, lambda: run_disk_full_cycles(
            harness, disk, cycles=args.disk_full_cycles, seconds=args.max_seconds
        )

    return run_long(args, "salvor-composed-chaos-", build, kept="daemon logs and ledger")


if __name__ == "__main__":
    sys.exit(main())
