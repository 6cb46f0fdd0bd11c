"""``salvor graph run FILE --remote URL``: a flow run on a daemon on another machine, its files sent
with the call and its baselines written back here.

The command collects the flow's members on this machine (``collect_flow``, the client policy),
asks the daemon which tool arguments are files (``GET /v1/tools``, sent as ``tool`` members),
sends ONE ``POST {URL}/v1/graph-runs`` asking for the ndjson stream, prints a line per node the
run enters, finishes or skips, then the result as a local run's, and writes the result's
``client_files`` (what the run's authoring tools saved for this machine: ``write_client_files``)
and ``baseline_writes`` by the client's rules (``write_baselines``). A daemon that does not read
members (``GET /v1/capabilities`` lists no ``flow_members``) gets the graph registered by hash
instead (``_remote_compat``), and a flow that needs files is refused here.

The call is never sent twice: a connection that drops before the result exits 1 saying the flow
may have run and where to watch it. The stream has no read timeout (the daemon sends a keepalive
line every 15 s); connecting has one. The token is ``SALVOR_TOKEN``'s, never an argument.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import trio
from salvor.protocol import InvalidGraph, names_files

from ..graphs import BadDirective, FlowFiles, directive_writes
from ._baselines import write_baselines
from ._client_files import write_client_files
from ._errors import CliError, UsageError
from ._flow_uploads import call_with_uploads
from ._graph import collect_flow_files, read_graph, unreadable
from ._named_flow_run import names_a_flow
from ._remote_compat import by_hash_body, follow_events, refusal_sentence, register_agents

TOKEN_VAR = "SALVOR_TOKEN"
NDJSON = "application/x-ndjson"
CONNECT_SECONDS = 10.0
EXIT_OK, EXIT_ERROR, EXIT_RUN_FAILED = 0, 1, 3


async def flow_call_body(client: httpx.AsyncClient, files: FlowFiles) -> dict:
    """The ``flow``, ``members`` and ``update_baselines`` fields of the call for ``files``: the
    members inline up to the inline budget, each further one sent ahead to ``POST /v1/uploads``
    (``call_with_uploads``).

    Raises:
        CliError: an upload was refused (a proxy's 413 among them); the call is not sent.
    """
    return await call_with_uploads(client, files.bundle, files.contents)


def _client(url: str) -> httpx.AsyncClient:
    headers = {"Accept-Encoding": "identity", "X-Salvor-Linked": "1"}
    token = os.environ.get(TOKEN_VAR)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    # No read timeout: a node may take longer than any bound, and keepalives prove the link.
    timeout = httpx.Timeout(None, connect=CONNECT_SECONDS)
    return httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout)


async def remote_main(args: argparse.Namespace) -> int:
    """Run FILE on the daemon at ``args.remote``; the exit status (``_main``'s)."""
    url = args.remote.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--remote {args.remote!r} must be an http:// or https:// URL")
    if args.run_id is not None:
        raise UsageError("--run-id: a remote daemon chooses the run's id")
    if await names_a_flow(args):
        return await _call_by_name(url, args)
    try:
        graph = await read_graph(args.file)
    except OSError as exc:
        raise CliError(unreadable(args.file, exc)) from None
    except InvalidGraph as exc:
        raise CliError(
            f"{args.file} is not a valid graph document ({len(exc.errors)} error(s)); "
            f"`salvor graph validate {args.file}` lists them"
        ) from None
    if args.update_baselines and not names_files(graph.nodes):
        raise UsageError(f"--update-baselines: {args.file} has no snapshot node")
    files = None
    async with _client(url) as client:
        try:
            members = await _reads_members(client, url)
            await register_agents(client, url, args.agent)
            if members:
                files = await collect_flow_files(
                    args.file,
                    update_baselines=args.update_baselines,
                    over_link=True,
                    as_json=args.json,
                    file_inputs=await _file_inputs(client, url),
                )
                body = await flow_call_body(client, files)
            else:
                body = await by_hash_body(client, url, args.file, graph)
        except httpx.TransportError as exc:
            raise CliError(_unreachable(url, exc)) from None
        body["input"] = args.input
        if args.label:
            body["labels"] = dict(args.label)
        return await _call(client, url, body, files, args.json)


async def _call_by_name(url: str, args: argparse.Namespace) -> int:
    """A run of the flow the daemon at ``url`` keeps as ``args.file`` (``flow_name``): its graph
    and files are the daemon's, so nothing is sent but the name, and no baseline comes back."""
    async with _client(url) as client:
        try:
            await register_agents(client, url, args.agent)
        except httpx.TransportError as exc:
            raise CliError(_unreachable(url, exc)) from None
        body = {"flow_name": args.file, "input": args.input}
        if args.label:
            body["labels"] = dict(args.label)
        return await _call(client, url, body, None, args.json)


async def _reads_members(client: httpx.AsyncClient, url: str) -> bool:
    """Whether the daemon at ``url`` reads a flow's members with the call."""
    response = await client.get("/v1/capabilities")
    if response.status_code != 200:
        raise CliError(refusal_sentence(url, response))
    try:
        capabilities = response.json().get("capabilities", {})
    except (ValueError, AttributeError):
        raise CliError(f"{url} does not answer as a salvor daemon (GET /v1/capabilities)") from None
    return isinstance(capabilities, dict) and capabilities.get("flow_members") is True


async def _file_inputs(client: httpx.AsyncClient, url: str) -> dict[str, list[str]]:
    """The file inputs the daemon's tools declare (``GET /v1/tools``), tool name -> arguments;
    none from a daemon that lists no tools (one older than the listing answers 404)."""
    response = await client.get("/v1/tools")
    if response.status_code == 404:
        return {}
    if response.status_code != 200:
        raise CliError(refusal_sentence(url, response))
    try:
        tools = response.json()["tools"]
        return {
            tool["name"]: [entry["target"] for entry in tool["file_inputs"]]
            for tool in tools
            if tool["file_inputs"]
        }
    except (ValueError, KeyError, TypeError):
        raise CliError(f"{url} does not answer as a salvor daemon (GET /v1/tools)") from None


async def _call(
    client: httpx.AsyncClient, url: str, body: dict, files: FlowFiles | None, as_json: bool
) -> int:
    """Send the call once and follow it to its result; the exit status."""
    run_id = None
    result = None
    request = client.build_request("POST", "/v1/graph-runs", json=body, headers={"Accept": NDJSON})
    try:
        response = await client.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise CliError(_unreachable(url, exc)) from None
    except httpx.TransportError as exc:
        raise CliError(_dropped(url, None, exc)) from None
    try:
        if response.status_code not in (200, 201):
            await response.aread()
            raise CliError(refusal_sentence(url, response))
        if response.headers.get("content-type", "").startswith(NDJSON):
            lines = _ndjson(response)
        else:  # a daemon without the stream answers 201: its event stream is the progress
            await response.aread()
            lines = follow_events(client, response.json()["run"])
        async for line in lines:
            kind = line.get("type")
            if kind == "started":
                run_id = line.get("run")
                _show(as_json, run_id)
            elif kind == "node":
                if not as_json:
                    print(f"node {line['node']} {line['status']}", flush=True)
            elif kind == "result":
                result = line
                break
    except httpx.TransportError as exc:
        raise CliError(_dropped(url, run_id, exc)) from None
    finally:
        await response.aclose()
    if result is None:
        raise CliError(_dropped(url, run_id, None))
    return await _finish(url, result, files, as_json)


async def _ndjson(response: httpx.Response) -> AsyncIterator[dict]:
    async for text in response.aiter_lines():
        if text.strip():
            try:
                yield json.loads(text)
            except ValueError:
                continue  # not a line of ours (a proxy's page): the result decides


def _unreachable(url: str, exc: Exception) -> str:
    return f"cannot reach the daemon at {url}: {exc or type(exc).__name__}; nothing was sent"


def _show(as_json: bool, run_id: Any) -> None:
    if not as_json:
        print(run_id, flush=True)


def _dropped(url: str, run_id: str | None, exc: Exception | None) -> str:
    why = f" ({exc or type(exc).__name__})" if exc is not None else ""
    if run_id is None:
        watch = f"list the daemon's runs (GET {url}/v1/runs) to find it"
    else:
        watch = f"watch run {run_id} with GET {url}/v1/runs/{run_id}/events"
    return (
        f"the connection to {url} closed before the flow finished{why}; it may have run: {watch} "
        "and check its effects before you run it again"
    )


async def _finish(url: str, result: dict, files: FlowFiles | None, as_json: bool) -> int:
    """Write the files the run saved for this machine, print the result, write its baselines;
    the exit status."""
    run_id, status = result.get("run"), result.get("status")
    try:
        saved = directive_writes(result.get("client_files", []), "client_files")
        writes = directive_writes(result.get("baseline_writes", []))
    except BadDirective as exc:
        raise CliError(f"run {run_id}: the daemon's {exc}") from None
    written, not_written = await trio.to_thread.run_sync(write_client_files, files, saved)
    if as_json:
        # Each directive is answered by the path written, or by the path and why it was not.
        outcomes = [*written, *({"path": p, "error": e} for p, e in not_written.items())]
        print(json.dumps({**result, "client_files": outcomes}, ensure_ascii=False), flush=True)
    else:
        print(_sentence(url, result), flush=True)
        for path in written:
            print(f"wrote {path}", flush=True)
    refused = [f"client file not written: {path}: {why}" for path, why in not_written.items()]
    code = EXIT_RUN_FAILED if status == "failed" else EXIT_OK
    if writes and files is None:  # a graph sent by hash asked for no baselines: none is written
        refused += [f"baseline not written: {path}: this call sent no flow" for path in writes]
    elif writes:
        refused += await trio.to_thread.run_sync(
            lambda: write_baselines(files, writes, as_json=as_json)
        )
    for sentence in refused:
        shown = json.dumps({"warning": sentence}) if as_json else f"salvor: {sentence}"
        print(shown, file=sys.stderr, flush=True)
    return EXIT_ERROR if refused else code


def _sentence(url: str, result: dict) -> str:
    """Where the remote run rests, as ``salvor graph run`` says it of a local one."""
    run_id, state = result.get("run"), result.get("status")
    detail = result.get("detail") if isinstance(result.get("detail"), dict) else {}
    if state == "completed":
        return f"run {run_id} completed: {json.dumps(result.get('output'), ensure_ascii=False)}"
    if state == "failed":
        return f"run {run_id} failed: {result.get('error', '')}"
    if state == "abandoned":
        return f"run {run_id} abandoned" + (f": {detail['reason']}" if "reason" in detail else "")
    if state == "suspended":
        return (
            f"run {run_id} suspended, waiting on a person: {detail.get('reason', '')}; resume it "
            f"with POST {url}/v1/runs/{run_id}/resume, the JSON matching "
            f"{json.dumps(detail.get('input_schema'))}"
        )
    return f"run {run_id} is {state} (GET {url}/v1/runs/{run_id} says more)"
