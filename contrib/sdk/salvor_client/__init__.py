"""A client for salvor: client-driven runs (your loop, salvor's durable log), and the control
plane's graph documents.

The loop lives in your process; the daemon keeps the log, checks every
append, performs the steps that need its keys (``model_step``,
``tool_step``) and records the ones you perform yourself (``client_tool``,
``client_model``). ``ClientRun`` keeps a cursor over the run's log, so a loop
that crashed simply runs again from the top: every step already recorded is
answered from the log (nothing is paid for or performed twice) and the loop
carries on live where the log ends.

Works under trio and asyncio alike (httpx and anyio underneath). A daemon is named by its URL,
or by ``unix:PATH`` when it listens on a Unix socket (``salvor serve --listen unix:PATH``)::

    async with ClientRun("http://127.0.0.1:8420") as run:
        # Every call, this one too, is answered from the log when it is already recorded.
        await run.start(agent="sha256:...", input={"task": "..."})
        answer = await run.model_step({"model": "...", "max_tokens": 512, "messages": [...]})
        ...
        await run.complete({"reply": "..."})

Leaving the ``async with`` (normally or by an exception) hands the lease
back, so the next process can pick the run up at once.

``Salvor`` holds the calls that are not one run's, such as the graph documents::

    async with Salvor("http://127.0.0.1:8420") as salvor:
        graph = (await salvor.submit_graph(Path("publish.yaml").read_text()))["graph"]

``open_live`` (or ``Salvor.live``) is the live WebSocket: runs' events and the run list on one
connection, resumed by cursor after a drop. It alone is trio only (``trio-websocket``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Self
from urllib.parse import quote

import anyio
import httpx

from ._address import async_client, http_origin
from ._errors import SalvorError
from ._live import Live, open_live

__all__ = ["ClientRun", "Live", "Salvor", "SalvorError", "open_live"]

SCHEMA_VERSION = 1


class ClientRun:
    """One client-driven run, driven through one lease.

    Args:
      base_url: the daemon, e.g. ``http://127.0.0.1:8420``, or ``unix:/run/user/1000/salvor.sock``
        for one listening on a Unix socket.
      run_id: a run to open again (after a crash or a restart); None mints a new one.
      auth_token: the daemon's bearer token, when it was started with ``--auth-token``.
      client: an ``httpx.AsyncClient`` to share (closed by its owner, not here; for a Unix
        socket it must carry the socket's transport itself).
    """

    def __init__(
        self,
        base_url: str,
        *,
        run_id: str | None = None,
        auth_token: str | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.daemon = base_url
        self.base_url = http_origin(base_url)
        self.run_id = run_id
        self.token: str | None = None
        self.log: list[dict] = []
        self.cursor = 0
        self._headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._client = client
        self._owns_client = client is None
        self._timeout = timeout

    # -- the lease ---------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            with anyio.CancelScope(shield=True):
                await self.release()
        finally:
            if self._owns_client and self._client is not None:
                await self._client.aclose()

    async def open(self, *, record_prompts: bool = False) -> list[dict]:
        """Open (or adopt) the run and rebuild the cursor from its recorded log; returns the log."""
        if self._client is None:
            self._client = async_client(self.daemon, self._timeout)
        body: dict[str, Any] = {"record_prompts": record_prompts}
        if self.run_id is not None:
            body["run_id"] = self.run_id
        answer = await self._post("/v1/client-runs", body)
        self.run_id, self.token, self.log = answer["run"], answer["drive_token"], answer["log"]
        self.cursor = 0
        return self.log

    async def release(self) -> bool:
        """Hand the lease back (idempotent)."""
        if self.token is None or self._client is None:
            return False
        answer = await self._post(f"/v1/client-runs/{self.run_id}/release", None)
        self.token = None
        return answer["released"]

    async def heartbeat(self) -> int:
        """Say "still here" inside a long body; returns the seconds the lease now lasts."""
        return (await self._post(f"/v1/client-runs/{self.run_id}/heartbeat", None))[
            "lapses_in_seconds"
        ]

    @asynccontextmanager
    async def keep_alive(self, every: float | None = None) -> AsyncIterator[None]:
        """Heartbeat in the background for the body of the ``async with``
        (a long tool, a long render)."""
        interval = every if every is not None else max(0.5, (await self.heartbeat()) / 3)
        async with anyio.create_task_group() as beats:

            async def beat() -> None:
                while True:
                    await anyio.sleep(interval)
                    await self.heartbeat()

            beats.start_soon(beat)
            try:
                yield
            finally:
                beats.cancel_scope.cancel()

    # -- the cursor --------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return bool(self.log)

    def _recorded(self, kind: str) -> dict | None:
        """The recorded event at the cursor when it is ``kind`` (a replayed step), else None."""
        if self.cursor < len(self.log):
            envelope = self.log[self.cursor]
            if envelope["event"]["kind"] != kind:
                raise SalvorError(
                    409,
                    "divergence",
                    f"the loop asks for a {kind} where the log has "
                    f"{envelope['event']['kind']} at seq {self.cursor}",
                )
            return envelope["event"]["payload"]
        return None

    def _completion(self, seq: int) -> dict | None:
        for envelope in self.log[seq + 1 :]:
            if (
                envelope["event"]["kind"] in ("ModelCallCompleted", "ToolCallCompleted")
                and envelope["event"]["payload"]["seq"] == seq
            ):
                return envelope["event"]["payload"]
        return None

    async def append(self, kind: str, payload: dict) -> dict:
        """Record one control event at the cursor (a replay re-sends what is recorded: a no-op)."""
        recorded = self._recorded(kind)
        if recorded is not None:
            self.cursor += 1
            return recorded
        envelope = {
            "run_id": self.run_id,
            "seq": self.cursor,
            "schema_version": SCHEMA_VERSION,
            "recorded_at": _now(),
            "event": {"kind": kind, "payload": payload},
        }
        await self._post(f"/v1/client-runs/{self.run_id}/events", {"events": [envelope]})
        self.log.append(envelope)
        self.cursor += 1
        return payload

    async def start(
        self, *, agent: str, input: Any = None, labels: dict[str, str] | None = None
    ) -> None:
        payload: dict[str, Any] = {"agent_def_hash": agent, "input": input}
        if labels:
            payload["labels"] = labels
        await self.append("RunStarted", payload)

    async def now(self) -> str:
        """A clock reading, recorded; a replay reads the recorded one back."""
        return (await self.append("NowObserved", {"now": _now()}))["now"]

    async def complete(self, output: Any) -> None:
        await self.append("RunCompleted", {"output": output})

    async def fail(self, error: str) -> None:
        await self.append("RunFailed", {"error": error})

    # -- steps -------------------------------------------------------------------------------------

    async def model_step(self, request: dict) -> dict:
        """The daemon calls the model (it holds the key); ``{"response", "usage"}``."""
        return await self._step("model-step", {"seq": self.cursor, "request": request})

    async def tool_step(self, tool: str, input: Any, idempotency_key: str | None = None) -> Any:
        """The daemon performs one of its registered tools; its output."""
        body = {
            "seq": self.cursor,
            "tool": tool,
            "input": input,
            "idempotency_key": idempotency_key,
        }
        return (await self._step("tool-step", body))["output"]

    async def client_tool(
        self, tool: str, input: Any, perform: Callable[[Any, str], Awaitable[Any]]
    ) -> Any:
        """A declared tool this process performs itself, write-ahead: ``perform(input, key)`` runs
        only when the call is not already settled, under the key the daemon derived; a failure is
        recorded as the call's error and raised again."""
        seq = self.cursor
        opened = await self._post(
            f"/v1/client-runs/{self.run_id}/client-tool-intent",
            {"seq": seq, "tool": tool, "input": input},
        )
        if opened["settled"]:
            await self._advance_past(seq)
            return opened["output"]
        try:
            async with self.keep_alive():
                output = await perform(input, opened["idempotency_key"])
        except Exception as exc:
            await self._post(
                f"/v1/client-runs/{self.run_id}/client-tool-completion",
                {"seq": seq, "error": {"message": f"{type(exc).__name__}: {exc}"}},
            )
            await self._advance_past(seq)
            raise
        await self._post(
            f"/v1/client-runs/{self.run_id}/client-tool-completion", {"seq": seq, "output": output}
        )
        await self._advance_past(seq)
        return output

    async def _step(self, name: str, body: dict) -> dict:
        seq = self.cursor
        answer = await self._post(f"/v1/client-runs/{self.run_id}/{name}", body)
        await self._advance_past(seq)
        return answer

    async def _advance_past(self, seq: int) -> None:
        """Move the cursor past the intent at ``seq`` and its completion, reading
        the log's tail when needed."""
        if self._completion(seq) is None:
            tail = await self._get(
                f"/v1/client-runs/{self.run_id}/log", {"from_seq": len(self.log)}
            )
            self.log.extend(tail["log"])
        completion_at = next(
            (
                i
                for i, e in enumerate(self.log)
                if i > seq
                and e["event"]["kind"] in ("ModelCallCompleted", "ToolCallCompleted")
                and e["event"]["payload"]["seq"] == seq
            ),
            None,
        )
        if completion_at is None:
            raise SalvorError(
                409, "divergence", f"the call at seq {seq} has no completion in the log"
            )
        self.cursor = completion_at + 1

    # -- HTTP --------------------------------------------------------------------------------------

    async def _post(self, path: str, body: Any) -> dict:
        headers = dict(self._headers)
        if self.token:
            headers["X-Drive-Token"] = self.token
        if body is None:
            return _answer(await self._client.post(self.base_url + path, headers=headers))
        return _answer(await self._client.post(self.base_url + path, json=body, headers=headers))

    async def _get(self, path: str, params: dict) -> dict:
        return _answer(
            await self._client.get(self.base_url + path, params=params, headers=self._headers)
        )


class Salvor:
    """The daemon's calls that belong to no one client-driven run: graph documents, graph runs
    and their forks.

    Args:
      base_url: the daemon, e.g. ``http://127.0.0.1:8420``, or ``unix:/run/user/1000/salvor.sock``
        for one listening on a Unix socket.
      auth_token: the daemon's bearer token, when it was started with ``--auth-token``.
      client: an ``httpx.AsyncClient`` to share (closed by its owner, not here; for a Unix
        socket it must carry the socket's transport itself).

    Every call raises ``SalvorError`` (the envelope's status, code, message and details) when the
    daemon refuses it.
    """

    def __init__(
        self,
        base_url: str,
        *,
        auth_token: str | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.daemon = base_url
        self.base_url = http_origin(base_url)
        self._auth_token = auth_token
        self._headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._client = client if client is not None else async_client(base_url, timeout)
        self._owns_client = client is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def live(self, **options: Any) -> AbstractAsyncContextManager[Live]:
        """The daemon's live WebSocket, with this client's token (``open_live``; trio only)::

        async with salvor.live() as live:
            await live.subscribe(run)
            async for message in live: ...
        """
        return open_live(self.daemon, auth_token=self._auth_token, **options)

    # -- graphs ------------------------------------------------------------------------------------

    async def submit_graph(self, document: Any) -> dict:
        """Store a graph document: ``{"graph": "sha256:...", "created": bool}``.

        ``document`` is the parsed document (sent as JSON), or the text of a document file
        (``str``, sent as YAML: a JSON text is YAML too). ``created`` is False when the same
        document was already stored. An invalid one raises ``SalvorError`` with code
        ``invalid_graph`` and every error in ``details["errors"]``.
        """
        return await self._send("/v1/graphs", document)

    async def validate_graph(self, document: Any) -> dict:
        """Check a document without storing it (as ``submit_graph`` takes it):
        ``{"valid": True, "graph", "summary"}`` or ``{"valid": False, "errors": [...]}``."""
        return await self._send("/v1/graphs/validate", document)

    async def list_graphs(self) -> list[dict]:
        """Every stored graph, oldest first: its ``graph`` hash, ``node_count``, ``edge_count``,
        ``entry_nodes`` and ``terminal_nodes``."""
        return (await self._get("/v1/graphs"))["graphs"]

    async def get_graph(self, graph_hash: str) -> dict:
        """A stored graph, ``{"graph", "document"}`` (the document as it was submitted); an
        unknown hash raises ``SalvorError`` with code ``unknown_graph``."""
        return await self._get(f"/v1/graphs/{quote(graph_hash, safe=':')}")

    # -- graph runs --------------------------------------------------------------------------------

    async def start_graph_run(
        self, graph_hash: str, input: Any = None, labels: dict[str, str] | None = None
    ) -> str:
        """Start a run of a stored graph; returns the new run's id (the daemon walks it on its
        own). An unknown graph raises ``SalvorError`` with code ``unknown_graph``; nothing is
        started then."""
        body: dict[str, Any] = {"graph_hash": graph_hash, "input": input}
        if labels:
            body["labels"] = labels
        return (await self._post("/v1/graph-runs", body))["run"]

    async def graph_projection(self, run: str) -> dict:
        """A graph run's per-node projection: ``{"run", "graph_hash", "nodes": [...]}``, with
        ``current_node`` while a node is open and ``forked_from`` on a fork."""
        return await self._get(f"/v1/runs/{quote(run, safe='')}/graph")

    async def fork(
        self,
        run: str,
        from_node: str,
        acknowledge_writes: Iterable[int] = (),
        dry_run: bool = False,
    ) -> dict:
        """Fork a graph run from ``from_node``: ``{"run", "status", "forked_from"}``, or with
        ``dry_run`` the plan (``writes``, ``unacknowledged_writes``, ``would_proceed``) and
        nothing created.

        A re-walked write not in ``acknowledge_writes`` (the origin seqs) raises ``SalvorError``
        with code ``write_replay_hazard`` and the writes in ``details["writes"]``; the origin is
        unchanged and no run is created.
        """
        body: dict[str, Any] = {"from_node": from_node}
        acknowledged = list(acknowledge_writes)
        if acknowledged:
            body["acknowledge_writes"] = acknowledged
        if dry_run:
            body["dry_run"] = True
        return await self._post(f"/v1/runs/{quote(run, safe='')}/fork", body)

    async def forks(self, run: str) -> list[dict]:
        """The forks of ``run``, oldest first: each one's ``run``, ``from_node``, ``through_seq``
        and ``acknowledged_writes``."""
        return (await self._get(f"/v1/runs/{quote(run, safe='')}/forks"))["forks"]

    # -- HTTP --------------------------------------------------------------------------------------

    async def _post(self, path: str, body: Any) -> dict:
        return _answer(
            await self._client.post(self.base_url + path, json=body, headers=self._headers)
        )

    async def _send(self, path: str, document: Any) -> dict:
        if isinstance(document, str):
            headers = {**self._headers, "Content-Type": "application/yaml"}
            reply = await self._client.post(
                self.base_url + path, content=document.encode("utf-8"), headers=headers
            )
        else:
            reply = await self._client.post(
                self.base_url + path, json=document, headers=self._headers
            )
        return _answer(reply)

    async def _get(self, path: str) -> dict:
        return _answer(await self._client.get(self.base_url + path, headers=self._headers))


def _answer(reply: httpx.Response) -> dict:
    try:
        body = reply.json()
    except ValueError:
        body = None
    if reply.status_code >= 400:
        error = (body or {}).get("error", {}) if isinstance(body, dict) else {}
        raise SalvorError(
            reply.status_code,
            error.get("code", "http_error"),
            error.get("message", reply.text[:300]),
            error.get("details"),
        )
    return body


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
