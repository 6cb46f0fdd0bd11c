"""``salvor graph``: graph documents on the command line. ``salvor graph validate FILE`` checks
one here, with no store and no server, and says every error the way ``POST /v1/graphs`` would.
``salvor graph run FILE`` stores the document (and the agent files it is given) in the local
store, starts a graph run of it and drives it to where it rests, as ``salvor run`` does an agent.

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
from salvor.protocol import (
    FileInputs,
    Graph,
    GraphError,
    InvalidGraph,
    names_files,
    parse_graph_json,
    parse_graph_yaml,
)

from ..agents import AgentDefinition, parse_definition
from ..graphs import FlowFiles, check_flow
from ._arguments import add_label_option, json_value, run_uuid
from ._errors import CliError
from ._flow_collect import collect_flow

EXIT_VALID, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2

_BY_SUFFIX = {".json": parse_graph_json, ".yaml": parse_graph_yaml, ".yml": parse_graph_yaml}


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "graph", help="graph documents: `salvor graph validate FILE`, `salvor graph run FILE`"
    )
    verbs = p.add_subparsers(dest="graph_command", required=True, metavar="VERB")
    _add_run(verbs, common)
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


def _add_run(verbs, common: argparse.ArgumentParser) -> None:
    r = verbs.add_parser(
        "run",
        parents=[common],
        help="start a run of a graph document in the local store and drive it",
        description="Stores FILE and the --agent files, starts a graph run and drives it until "
        "it completes, fails or waits (a gate, a delay); `salvor resume RUN` continues it.",
    )
    r.add_argument("file", metavar="FILE", help="the graph document (JSON or YAML)")
    r.add_argument(
        "--input", metavar="JSON", type=json_value("--input"), help="the run's input (default null)"
    )
    r.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="FILE",
        help="an agent file a node names by its hash (repeatable; agents already stored need none)",
    )
    r.add_argument(
        "--update-baselines",
        action="store_true",
        help="record each snapshot's value and each pinned agent's calls as their new baselines "
        "(written beside the flow file once the run completes) instead of comparing them",
    )
    r.add_argument(
        "--remote",
        metavar="URL",
        help="run it on the daemon at URL instead, the flow's files sent with the call and its "
        "baselines written back here (the token, if any, from SALVOR_TOKEN)",
    )
    add_label_option(r)
    r.add_argument("--run-id", metavar="UUID", type=run_uuid, help="choose the run id")


async def read_graph(path: str) -> Graph:
    """The graph document in ``path``, parsed and validated off the trio thread.

    Raises:
        OSError: the file cannot be read.
        InvalidGraph: it is not a valid document (every error in it).
    """
    data = await trio.Path(path).read_bytes()
    return await trio.to_thread.run_sync(_parser_for(path, data), data)


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


def unreadable(path: str, exc: OSError) -> str:
    return f"cannot read graph file {path!r}: {exc.strerror or exc}"


async def collect_flow_files(
    path: str,
    *,
    update_baselines: bool = False,
    over_link: bool = False,
    file_inputs: FileInputs | None = None,
    as_json: bool = False,
) -> FlowFiles:
    """The flow file ``path`` and the files it reaches (``collect_flow``), off the trio thread.

    Raises:
        CliError: the flow file itself cannot be read.
    """
    try:
        return await trio.to_thread.run_sync(
            lambda: collect_flow(
                path,
                update_baselines=update_baselines,
                over_link=over_link,
                file_inputs=file_inputs,
                as_json=as_json,
            )
        )
    except OSError as exc:
        raise CliError(unreadable(path, exc)) from None


class _AnyTool:
    """The tools an agent file may name when no registry is at hand (``graph validate``): any."""

    def __contains__(self, name: object) -> bool:
        return True

    def __iter__(self):
        return iter(())


def _parse_offline(text: str, fmt: str, read_prompt) -> AgentDefinition:
    return parse_definition(text, fmt, known_tools=_AnyTool(), read_prompt=read_prompt)


async def _flow_errors(path: str) -> list[GraphError]:
    """The pre-check's errors of the flow file ``path`` with its files as this machine holds
    them (an agent file's tools are not checked: no registry is at hand here)."""
    files = await collect_flow_files(path)
    return (await trio.to_thread.run_sync(check_flow, files, _parse_offline)).errors


async def validate_main(args: argparse.Namespace) -> int:
    graph, errors = None, []
    try:
        # Off the trio thread, as the daemon does: a large document takes a while to check.
        graph = await read_graph(args.file)
    except OSError as exc:
        print(f"salvor: {unreadable(args.file, exc)}", file=sys.stderr, flush=True)
        return EXIT_UNREADABLE
    except InvalidGraph as exc:
        errors = exc.errors
    if graph is not None and names_files(graph.nodes):
        try:
            errors = await _flow_errors(args.file)
        except CliError as exc:
            print(f"salvor: {exc}", file=sys.stderr, flush=True)
            return EXIT_UNREADABLE
        if errors:
            graph = None
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
