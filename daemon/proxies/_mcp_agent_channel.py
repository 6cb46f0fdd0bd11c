"""What a stand-in sends its agent unasked: the server-push stream, and the
server's requests awaiting answers.

A streamable-HTTP agent (or the stdio relay) holds the push stream open with
a ``GET`` (``_mcp_endpoint``); at most one is open per lane. Notifications
go down it as they are handed over; a request the server sends the agent
(sampling, elicitation, roots) goes down it too, and the agent's answer comes
back as a POST that ``answered`` routes to the request waiting on it.
"""

from __future__ import annotations

import contextlib
import json

import trio

from ._mcp_replay import INTERNAL_ERROR, error_answer

METHOD_NOT_FOUND = -32601
# Messages queued for a push stream; more are dropped (an agent not reading).
MAX_PUSHED = 256


class AgentChannel:
    """The push stream of one lane, and the server's requests waiting on the agent."""

    def __init__(self, server: str) -> None:
        self.server = server
        self._push: trio.MemorySendChannel | None = None
        self._pushed: trio.MemoryReceiveChannel | None = None
        self._awaiting: dict[str, trio.MemorySendChannel] = {}

    def open_push(self) -> trio.MemoryReceiveChannel | None:
        """The channel of a new push stream; None while another one is open."""
        if self._push is not None:
            return None
        self._push, self._pushed = trio.open_memory_channel(MAX_PUSHED)
        return self._pushed

    def close_push(self, receiving: trio.MemoryReceiveChannel | None = None) -> None:
        """End the push stream (only the one ``receiving`` reads, when given)."""
        if self._push is not None and (receiving is None or receiving is self._pushed):
            self._push.close()
            self._push = self._pushed = None

    def push(self, messages: list[dict]) -> None:
        """Hand messages to the push stream, if one is open (what does not fit is dropped)."""
        for message in messages:
            if self._push is None:
                return
            try:
                self._push.send_nowait(message)
            except (trio.WouldBlock, trio.ClosedResourceError):
                return

    async def ask(self, request: dict, timeout: float) -> dict:
        """Send the agent a request of the server's and wait up to ``timeout`` for its answer.

        Error handling: with no push stream open, or no answer in time, the
        answer is a JSON-RPC error saying so (the server hears it; nothing fails).
        """
        request_id = request.get("id")
        if self._push is None:
            return error_answer(
                request_id,
                METHOD_NOT_FOUND,
                (
                    "the agent has no server-push stream open to salvor's stand-in for "
                    f"{self.server!r}, so it cannot be asked {request.get('method')}"
                ),
            )
        key = json.dumps(request_id)
        sending, receiving = trio.open_memory_channel(1)
        self._awaiting[key] = sending
        try:
            self.push([request])
            with trio.move_on_after(timeout):
                answer = await receiving.receive()
                return {
                    k: v for k, v in answer.items() if k in ("jsonrpc", "id", "result", "error")
                }
            return error_answer(
                request_id,
                INTERNAL_ERROR,
                f"the agent did not answer {request.get('method')} within {timeout:g}s",
            )
        finally:
            self._awaiting.pop(key, None)

    def answered(self, message: dict) -> None:
        """Route the agent's answer to the request waiting on it (a stray answer is dropped)."""
        waiting = self._awaiting.get(json.dumps(message.get("id")))
        if waiting is not None:
            with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                waiting.send_nowait(message)
