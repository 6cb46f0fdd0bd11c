"""The ``salvor`` command's words: every verb, its arguments and its help.

Each argument is checked as it is parsed (``_arguments``), so a usage error is one sentence and
exit status 2 before any store is opened; ``serve``, ``doctor`` and ``graph`` add their own verbs.
"""

from __future__ import annotations

import argparse
from typing import Any

from salvor import __version__

from ..runs import MISSING
from ._arguments import (
    Parser,
    add_label_option,
    json_value,
    key_value,
    run_limit,
    run_state,
    run_uuid,
)
from ._doctor import add_parser as add_doctor_parser
from ._graph import add_parser as add_graph_parser
from ._serve_flags import add_serve_parser


def command_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument(
        "--store",
        metavar="URL",
        help="store URL or SQLite path (default: $SALVOR_STORE, else the state directory)",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser = Parser(prog="salvor", description="Durable execution for AI agent runs.")
    parser.add_argument("--version", action="version", version=f"salvor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_run_verbs(sub, common)
    _add_read_verbs(sub, common)
    add_serve_parser(sub, common)

    # doctor opens no store, so it takes none of the common options.
    add_doctor_parser(sub)
    # `graph validate` checks a document on this machine and takes none either; `graph run` does.
    add_graph_parser(sub, common)
    _add_fork_parser(sub, common)

    p = sub.add_parser(
        "edit-mode",
        parents=[common],
        help="say whether agents are offered the flow authoring tools, or turn that on or off "
        "(for every run of the store, from its next model call)",
    )
    p.add_argument("state", nargs="?", choices=("on", "off"), help="turn it on or off")

    p = sub.add_parser("tools", help="tools attached to a run tree at run time")
    verbs = p.add_subparsers(dest="tools_command", required=True, metavar="VERB")
    p = verbs.add_parser(
        "attach",
        parents=[common],
        help="attach registry tools and declared MCP servers to a run and the children it "
        "starts (offered from each one's next model call)",
    )
    p.add_argument("run", metavar="RUN", type=run_uuid)
    p.add_argument("tool", metavar="TOOL", nargs="*", help="a registry tool's name")
    p.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="NAME",
        help="an MCP server the --attachable-mcp file declares, by name (repeatable)",
    )
    p.add_argument(
        "--attachable-mcp",
        default=None,
        metavar="FILE",
        help="the file of [[mcp_servers]] the daemon serves with (salvor serve --attachable-mcp): "
        "where each --mcp name is declared",
    )

    p = sub.add_parser(
        "replay", parents=[common], help="derive a run's state from its log, executing nothing"
    )
    p.add_argument("run", metavar="RUN", type=run_uuid)
    p.add_argument(
        "--dry-run", action="store_true", help="required: print the derived state as JSON"
    )
    return parser


def _add_run_verbs(sub, common: argparse.ArgumentParser) -> None:
    """The verbs that start, continue, settle or retire runs."""
    _add_starts(sub, common)
    p = sub.add_parser("resume", parents=[common], help="continue a parked or interrupted run")
    p.add_argument("run", metavar="RUN", type=run_uuid)
    p.add_argument(
        "--input",
        metavar="JSON",
        type=json_value("--input"),
        default=MISSING,
        help="the input a suspended run waits for, or a budget extension",
    )
    _add_settles(sub, common)
    sub.add_parser(
        "wake", parents=[common], help="drive every sleeping run whose instant has passed"
    )


def _add_starts(sub, common: argparse.ArgumentParser) -> None:
    """``run`` and ``rerun``: a new run of an agent, or of a recorded run again."""
    p = sub.add_parser("run", parents=[common], help="start a run of an agent and drive it")
    p.add_argument(
        "agent",
        metavar="AGENT",
        help="agent file (TOML, JSON or markdown) or a stored sha256: hash",
    )
    p.add_argument(
        "--input", metavar="JSON", type=json_value("--input"), help="the run's input (default null)"
    )
    add_label_option(p)
    p.add_argument("--run-id", metavar="UUID", type=run_uuid, help="choose the run id")

    p = sub.add_parser(
        "rerun",
        parents=[common],
        help=(
            "re-run a completed agent-process run against its recorded "
            "model calls (no upstream call)"
        ),
    )
    p.add_argument("run", metavar="RUN", type=run_uuid, help="the completed run to reproduce")
    p.add_argument(
        "--agent",
        metavar="AGENT",
        help="agent file or sha256: hash to run instead of the origin's own",
    )
    add_label_option(p)


def _add_settles(sub, common: argparse.ArgumentParser) -> None:
    """``resolve``, ``reconcile`` and ``abandon``: a person settles what a run cannot."""
    p = sub.add_parser("resolve", parents=[common], help="record by hand what a dangling write did")
    p.add_argument("run", metavar="RUN", type=run_uuid)
    p.add_argument(
        "--output",
        metavar="JSON",
        type=json_value("--output"),
        required=True,
        help="what the write returned",
    )
    _add_client_tool_option(
        p,
        "the declaration of the client tool whose write this is, to check the output "
        "against (as `salvor serve --client-tool` takes it; repeatable)",
    )

    p = sub.add_parser(
        "reconcile",
        parents=[common],
        help="list the runs parked on a write of unknown outcome, or settle one",
    )
    p.add_argument("run", metavar="RUN", nargs="?", type=run_uuid, help="the parked run to settle")
    p.add_argument(
        "--output",
        metavar="JSON",
        type=json_value("--output"),
        default=MISSING,
        help="the write happened and returned this",
    )
    p.add_argument(
        "--not-landed",
        action="store_true",
        help="the write did not happen: record a failed call and free its idempotency key, so "
        "calling it again performs it",
    )
    _add_client_tool_option(
        p,
        "the declaration of a client tool whose writes are parked, to say (and check) what "
        "its output must be (repeatable)",
    )

    p = sub.add_parser("abandon", parents=[common], help="retire a run by hand")
    p.add_argument("run", metavar="RUN", type=run_uuid)
    p.add_argument("--reason", metavar="TEXT")


def _add_client_tool_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--client-tool", action="append", default=[], metavar="FILE", help=help)


def _add_read_verbs(sub, common: argparse.ArgumentParser) -> None:
    """The verbs that read runs without changing them."""
    p = sub.add_parser("runs", parents=[common], help="list runs, newest first")
    p.add_argument("--state", metavar="STATE", type=run_state, help="only runs in this state")
    p.add_argument("--label", metavar="K=V", type=key_value, help="only runs with this label")
    p.add_argument(
        "--limit", default=50, type=run_limit, metavar="N", help="at most N runs (default 50)"
    )

    p = sub.add_parser(
        "history", parents=[common], help="a run's recorded events (--json: pinned envelopes)"
    )
    p.add_argument("run", metavar="RUN", type=run_uuid)

    p = sub.add_parser(
        "log",
        parents=[common],
        help="a run's events, readable, then where it rests (--json: an object per event, then "
        "the run's status)",
    )
    p.add_argument("run", metavar="RUN", type=run_uuid)


def _add_fork_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "fork",
        parents=[common],
        help="start a new run re-walking a graph run from a node, refusing to re-fire a recorded "
        "write until it is acknowledged",
    )
    p.add_argument("run", metavar="RUN", type=run_uuid, help="the graph run to fork")
    p.add_argument("--from-node", required=True, metavar="ID", help="the node to re-walk from")
    p.add_argument(
        "--graph",
        metavar="FILE",
        help="the run's graph document (JSON, or YAML by a .yaml/.yml name), checked against the "
        "hash the run recorded (default: the document this store holds)",
    )
    p.add_argument(
        "--acknowledge-writes",
        type=_acknowledged,
        default=(),
        metavar="SEQ,...|all",
        help="the origin seqs of the re-walked writes that may fire again, or all of them",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan (and what it would re-fire) only"
    )


def _acknowledged(text: str) -> tuple[int, ...] | None:
    """``--acknowledge-writes``: seqs, or None for ``all``."""
    if text.strip() == "all":
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() and len(part) <= 18 for part in parts):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} must be log positions such as 4,9 (or all)"
        )
    return tuple(int(part) for part in parts)
