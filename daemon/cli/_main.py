"""The `salvor` command line: drive and inspect runs in a store, no server needed.

Exit status: 0 when the command did what it was asked (a run that rests
suspended, sleeping, over budget or awaiting reconciliation is a success: it
is parked on purpose), 3 when a driven run ended failed, 1 for a refusal or an
error (one sentence on stderr, nothing recorded), 2 for a usage error.

Here the words are parsed (``_parser``), the store picked (``_command_store``) and the command
run (``_commands``, or its own module's for ``serve``, ``doctor`` and ``graph validate``); a
refusal from anywhere below becomes one sentence and its exit status.
"""

from __future__ import annotations

import argparse
import os
import sys

import trio
from salvor.protocol import CodedError

from ..agents import DefinitionError
from ..processes import make_undumpable
from ..recording import claim_wait_seconds, open_store_access
from ..runs import Runtime, own_store
from ..skills import SkillLibrary, skills_dirs_from_env
from ..tools import ToolRegistry, demo_registry
from ._command_store import SHARES_STORE, beside_hint, store_url
from ._commands import Cli, print_json
from ._doctor import doctor_main
from ._errors import EXIT_ERROR, EXIT_USAGE, CliError, UsageError
from ._graph import validate_main as graph_validate_main
from ._parser import command_parser
from ._pipes import readers_may_leave
from ._remote_flow import remote_main
from ._serve_command import serve_main
from ._wording import CLI_WORDING


async def _main(args: argparse.Namespace) -> int:
    if args.command == "doctor":
        return await doctor_main(args)
    if args.command == "graph" and args.graph_command == "validate":
        return await graph_validate_main(args)
    if args.command == "graph" and args.remote is not None:
        return await remote_main(args)  # no store here: the daemon at the URL keeps the run
    try:
        claim_wait_seconds()  # read again by every drive: a bad value is refused here, once
    except ValueError as exc:
        raise CliError(str(exc)) from None
    url = store_url(args)
    if args.command == "serve":
        return await serve_main(args, url)
    if args.command not in SHARES_STORE:
        async with open_store_access(url) as access:
            return await getattr(Cli(args, url), _verb(args.command))(
                Runtime(access, _local_registry(url))
            )
    async with (
        own_store(
            url, args.command, share=SHARES_STORE[args.command], run_hint=beside_hint(args)
        ) as locks,
        open_store_access(url) as access,
    ):
        return await getattr(Cli(args, url, locks), _verb(args.command))(
            Runtime(access, _local_registry(url))
        )


def _local_registry(url: str) -> ToolRegistry:
    """The tools of a command that drives runs here: the demo tools, and the skills of the
    folders ``SALVOR_SKILLS_DIRS`` names (as ``salvor serve --skills-dir`` would) before
    salvor's own."""
    registry = demo_registry(store_url=url)
    registry.skills = SkillLibrary(skills_dirs_from_env(os.environ))
    return registry


def _verb(command: str) -> str:
    """The ``Cli`` method a command runs (``edit-mode`` is ``cmd_edit_mode``)."""
    return "cmd_" + command.replace("-", "_")


def _sole(group: BaseExceptionGroup) -> BaseException:
    """The one exception a chain of single-member groups wraps, else the group itself."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def main(argv: list[str] | None = None) -> int:
    """The ``salvor`` command: its exit status (the module's docstring lists them)."""
    with readers_may_leave():
        return _command(argv)


def _command(argv: list[str] | None) -> int:
    args = command_parser().parse_args(argv)
    # The words as given: `salvor serve --workers N` starts its workers with them.
    args.argv = list(sys.argv[1:] if argv is None else argv)
    make_undumpable()  # before any secret is read: the same user's processes cannot read ours
    try:
        try:
            return trio.run(_main, args)
        except BaseExceptionGroup as group:
            # A refusal raised inside the daemon's nurseries arrives wrapped;
            # it is still one sentence.
            raise _sole(group) from None
    except CodedError as exc:
        message = exc.sentence(CLI_WORDING)
        if getattr(args, "json", False):
            print_json(exc.to_json(CLI_WORDING))
    except UsageError as exc:
        print(f"salvor: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except (CliError, DefinitionError) as exc:
        message = str(exc)
    except KeyboardInterrupt:
        message = (
            "interrupted; the run keeps its log and `salvor resume RUN` continues it (beside a "
            "daemon serving this store, POST /v1/runs/RUN/resume to that daemon)"
        )
    print(f"salvor: {message}", file=sys.stderr, flush=True)
    return EXIT_ERROR
