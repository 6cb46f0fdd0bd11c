"""The plain requests of a remote graph run: agents registered, the graph sent by hash to a daemon
that does not read a flow's members (``GET /v1/capabilities`` lists no ``flow_members``), its
progress read from the run's event stream when the daemon answers 201 instead of a stream, and a
refusal put in one sentence.

A flow that needs files (an agent file, a nested flow, a snapshot's baseline) cannot run on such
a daemon: it is refused here, before anything is sent.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import httpx
import trio
from salvor.protocol import Graph, ServerSentEvent, SSEDecoder, names_files

from ._errors import CliError

_AGENT_TYPES = {".md": "text/markdown", ".markdown": "text/markdown", ".json": "application/json"}
_NODE_STATUS = {"NodeEntered": "entered", "NodeExited": "finished", "NodeSkipped": "skipped"}


def refusal_sentence(url: str, response: httpx.Response) -> str:
    """An HTTP error answer of the daemon at ``url`` as one sentence (every error a pre-check
    lists named, with its node)."""
    try:
        error = response.json()["error"]
        code, message = error["code"], error["message"]
    except (ValueError, KeyError, TypeError):
        return f"the daemon at {url} answered {response.status_code} {response.reason_phrase}"
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    listed = [
        f"{item.get('node') or 'the flow'}: {item.get('message')}"
        for item in details.get("errors", [])
        if isinstance(item, dict)
    ]
    more = f" ({'; '.join(listed)})" if listed else ""
    return f"the daemon at {url} refused the run, {code}: {message}{more}"


async def register_agents(client: httpx.AsyncClient, url: str, paths: list[str]) -> None:
    """``POST /v1/agents`` each agent file a node names by hash (``--agent``).

    Raises:
        CliError: a file cannot be read or the daemon refused it; agents sent before it stay.
    """
    for path in paths:
        try:
            data = await trio.Path(path).read_bytes()
        except OSError as exc:
            raise CliError(f"--agent {path}: cannot read it ({exc.strerror or exc})") from None
        media = _AGENT_TYPES.get(os.path.splitext(path)[1].lower(), "application/toml")
        response = await client.post("/v1/agents", content=data, headers={"Content-Type": media})
        if response.status_code not in (200, 201):
            raise CliError(f"--agent {path}: {refusal_sentence(url, response)}")


async def by_hash_body(client: httpx.AsyncClient, url: str, path: str, graph: Graph) -> dict:
    """The call's body for a daemon that does not read members: the graph stored there first
    (``POST /v1/graphs``), named by its hash.

    Raises:
        CliError: the flow needs files such a daemon cannot be sent, or it refused the graph.
    """
    if names_files(graph.nodes):
        raise CliError(
            f"{path} names files (an agent file, a nested flow, a snapshot's or a pinned agent's "
            f"baseline) and the daemon at {url} does not take a flow's files with the call (its "
            "capabilities list no flow_members); update salvor there, or run the flow here "
            "without --remote"
        )
    response = await client.post(
        "/v1/graphs",
        content=json.dumps(graph.document),
        headers={"Content-Type": "application/json"},
    )
    if response.status_code not in (200, 201):
        raise CliError(refusal_sentence(url, response))
    return {"graph_hash": response.json()["graph"]}


async def follow_events(client: httpx.AsyncClient, run_id: str) -> AsyncIterator[dict]:
    """The stream's lines for ``run_id`` made from its server-sent events (a daemon that answers
    the call with 201): ``started``, a ``node`` line per node event, the ``result`` at ``end``.
    """
    yield {"type": "started", "run": run_id}
    async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        if response.status_code != 200:
            return
        decoder = SSEDecoder()
        async for chunk in response.aiter_bytes():
            for frame in decoder.feed(chunk):
                line = _line_of(run_id, frame)
                if line is not None:
                    yield line
                    if line["type"] == "result":
                        return


def _line_of(run_id: str, frame: ServerSentEvent) -> dict | None:
    """The stream line one server-sent event makes: a ``node`` line for a node event, the
    ``result`` at ``end``, None for anything else."""
    data = json.loads(frame.data)
    if frame.event == "end":
        return _result(run_id, data.get("status", {}))
    kind = data.get("event", {}).get("kind")
    if kind not in _NODE_STATUS:
        return None
    node = data["event"].get("payload", {}).get("node")
    return {"type": "node", "run": run_id, "node": node, "status": _NODE_STATUS[kind]}


def _result(run_id: str, status: dict) -> dict:
    result = {
        "type": "result",
        "run": run_id,
        "status": status.get("state"),
        "detail": status,
        "output": status.get("output"),
        "baseline_writes": [],
    }
    if "error" in status:
        result["error"] = status["error"]
    return result
