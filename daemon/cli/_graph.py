"""``salvor graph``: graph documents on the command line. ``salvor graph validate FILE`` checks
one here, with no store and no server, and says every error the way ``POST /v1/graphs`` would.

Exit status of ``validate``: 0 when the document is valid, 1 when it is not (every error, one a
line, on stdout: they are the answer asked for), 2 when the file cannot be read (one sentence on
stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import trio
from salvor.protocol import Graph, GraphError, InvalidGraph, parse_graph_json, parse_graph_yaml

EXIT_VALID, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2

_BY_SUFFIX = {".json": parse_graph_json, ".yaml": parse_graph_yaml, ".yml": parse_graph_yaml}


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="graph documents: `salvor graph validate FILE`")
    verbs = p.add_subparsers(dest="graph_command", required=True, metavar="VERB")
    v = verbs.add_parser(
        "validate",
        help="check a graph document (JSON or YAML) and print every error it has",
        description="Exit 0 when the document is valid, 1 when it is not, 2 when FILE cannot "
        "be read.",
    )
    v.add_argument(
        "file",
        metavar="FILE",
        help="the document: JSON (.json) or YAML (.yaml, .yml); any other name is read as "
        "JSON when it starts with { and as YAML otherwise",
    )
    v.add_argument(
        "--json", action="store_true", help="print the answer POST /v1/graphs/validate gives"
    )


def _parser_for(path: str, data: bytes):
    parse = _BY_SUFFIX.get(Path(path).suffix.lower())
    if parse is not None:
        return parse
    # A JSON document is an object; YAML's own spelling of one rarely starts with a brace.
    return parse_graph_json if data.lstrip(b" \t\r\n").startswith(b"{") else parse_graph_yaml


def validation_answer(graph: Graph | None, errors: list[GraphError]) -> dict:
    """What ``POST /v1/graphs/validate`` answers for this outcome (``--json`` prints it)."""
    if graph is not None:
        return {"valid": True, "graph": graph.hash, "summary": graph.summary()}
    return {"valid": False, "errors": [error.to_json() for error in errors]}


def error_line(error: GraphError) -> str:
    """``<code> <node or edge>: <message> (did you mean <suggestion>?)``; the place and the
    suggestion only when the error has them."""
    where = ""
    if error.node is not None:
        where = f" {error.node}"
    elif error.edge is not None:
        where = f" {error.edge[0]} -> {error.edge[1]}"
    hint = f" (did you mean {error.suggestion}?)" if error.suggestion is not None else ""
    return f"{error.code}{where}: {error.message}{hint}"


def _count(number: int, what: str) -> str:
    return f"{number} {what}" if number == 1 else f"{number} {what}s"


async def validate_main(args: argparse.Namespace) -> int:
    try:
        data = await trio.Path(args.file).read_bytes()
    except OSError as exc:
        print(
            f"salvor: cannot read graph file {args.file!r}: {exc.strerror or exc}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_UNREADABLE
    parse = _parser_for(args.file, data)
    graph, errors = None, []
    try:
        # Off the trio thread, as the daemon does: a large document takes a while to check.
        graph = await trio.to_thread.run_sync(parse, data)
    except InvalidGraph as exc:
        errors = exc.errors
    if args.json:
        print(json.dumps(validation_answer(graph, errors), ensure_ascii=False), flush=True)
    elif graph is not None:
        summary = graph.summary()
        print(
            f"valid: {graph.hash} ({_count(summary['node_count'], 'node')}, "
            f"{_count(summary['edge_count'], 'edge')})",
            flush=True,
        )
    else:
        print("\n".join(error_line(error) for error in errors), flush=True)
    return EXIT_VALID if graph is not None else EXIT_INVALID
