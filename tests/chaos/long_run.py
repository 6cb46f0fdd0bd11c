"""What the long chaos runs a person starts share (``composed_chaos``, ``cluster``): the flags
every one takes, the store (a new SQLite file, or a schema of its own in the PostgreSQL database
named), the run itself with an assertion counted as a violation, and the one JSON line of
figures with the exit status it implies.

A run's work directory is removed when nothing was found; otherwise it is kept (the daemons'
logs, the ledger) and named on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import _postgres_schema_url


def chaos_parser(prog: str) -> argparse.ArgumentParser:
    """A parser with the flags every long run takes: ``--store``, ``--seed``, ``--max-seconds``."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--store", help="a postgresql:// URL (default: a new SQLite file)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--max-seconds", type=float, default=6 * 3600.0)
    return parser


def chaos_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``argv`` parsed; a ``--store`` that is not PostgreSQL is a usage error (exit 2)."""
    args = parser.parse_args(argv)
    if args.store and not args.store.startswith("postgresql"):
        parser.error("--store takes a postgresql:// URL (SQLite is the default)")
    return args


def run_long(
    args: argparse.Namespace,
    prefix: str,
    build: Callable[[Path, str, contextlib.ExitStack], tuple[Any, Callable[[], None]]],
    *,
    kept: str,
) -> int:
    """Run one long chaos run and print its figures; the exit status (0: nothing violated and
    no run needing a hand).

    ``build(work, store_url, stack)`` makes the harness (closed when the run ends) and the
    callable that runs it; ``stack`` holds whatever else it opens. ``kept`` names what the work
    directory holds when it is kept.
    """
    work = Path(tempfile.mkdtemp(prefix=prefix))
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        store_url = f"sqlite:///{work / 'salvor.db'}"
        if args.store:
            store_url = stack.enter_context(
                contextlib.contextmanager(_postgres_schema_url)(args.store)
            )
        harness, run = build(work, store_url, stack)
        stack.callback(harness.close)
        try:
            run()
        except AssertionError as exc:  # a daemon would not start, or the API refused
            harness.violations.append(f"{harness.stop_named}: the run stopped: {exc}")
    figures = harness.figures(began)
    print(json.dumps(figures), flush=True)
    clean = not figures["violations"] and not figures["runs_needing_a_hand"]
    if clean:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"{kept} kept in {work}", file=sys.stderr)
    return 0 if clean else 1
