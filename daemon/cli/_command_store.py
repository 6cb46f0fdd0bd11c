"""Which store a command works on, and how it shares that store with a daemon serving it."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

from salvor.store import Holder, default_store_url, normalize_store_url, sqlite_path

from ..runs import MISSING
from ._errors import CliError
from ._hints import UNKNOWN_ADDRESS, daemon_address, resume_hint

# Which store lock each command takes (_store_owner): the commands that drive
# runs a daemon may be driving share it (so they refuse beside `salvor
# serve`), the ones that start a new run take only that run's lock (they work
# beside a daemon), the rest take none (reads, and single appends the store's
# seq guard keeps safe). Only `run`, `graph run` and `serve` may create a store.
SHARES_STORE = {
    "resume": True,
    "wake": True,
    "run": None,
    "rerun": None,
    "graph": None,
    "fork": None,
}


CREATES_STORE = ("run", "serve", "graph")


def beside_hint(args: argparse.Namespace) -> Callable[[Holder | None], str]:
    """What a command refused beside a daemon serving its store does instead (``resume`` asks
    that daemon, with the input it was given; ``wake`` need not)."""
    if args.command != "resume":
        return lambda daemon: "it wakes sleeping runs itself"
    run_input = None if args.input is MISSING else json.dumps(args.input, ensure_ascii=False)

    def hint(daemon: Holder | None) -> str:
        address = daemon_address(daemon.listen or "") if daemon is not None else UNKNOWN_ADDRESS
        return "resume the run through it: " + resume_hint(args.run, address, run_input)

    return hint


def store_url(args: argparse.Namespace) -> str:
    """The store the command works on, refused when no store can be there.

    A command that only reads or continues runs never creates a store. One that may create
    one (``run``, ``graph run``, ``serve``) creates the directories above it only for the
    default store in the state directory: a store named by ``--store`` or ``SALVOR_STORE`` in
    a directory that does not exist is a typo far more often than a wish.

    Raises:
        CliError: no store at the path, or no directory for it; nothing was created.
    """
    named = args.store or os.environ.get("SALVOR_STORE")
    url = normalize_store_url(args.store) if args.store else default_store_url()
    path = sqlite_path(url)
    if path is None or path.exists():
        return url
    missing_directory = named and not path.parent.is_dir()
    if args.command not in CREATES_STORE:
        creates = "`salvor run` or `salvor serve` creates a new one"
        if missing_directory:
            creates = f"`mkdir -p {path.parent}`, then {creates}"
        raise CliError(
            f"no store at {path}; name the store that holds your runs with --store or SALVOR_STORE "
            f"({creates})"
        )
    if missing_directory:
        raise CliError(
            f"no directory {path.parent} for the store {path}; create it first "
            f"(`mkdir -p {path.parent}`) or correct the --store path"
        )
    return url
