"""An open write of a lane settled by its probe, while the agent waits on it.

A run parked on an open ``write`` whose server declares a probe (``probes``)
is driven like any other: the agent's replay reaches that call, and while
the agent waits on it the lane asks the probe (a read of the same server,
over the lane's own session) and settles the write by its answer
(``probe_open_write``); a write with no probe is never performed again here.
The ``salvor`` lane's file writes carry their own plan and probe (``_salvor_writes``).
"""

from __future__ import annotations

import json
from typing import Any

import trio
from salvor.protocol import Actor, Effect, ToolCallCompleted

from ..mcp import McpNoAnswer, McpRemoteError, McpServerSpec, McpUnavailable, probe_answer
from ..recording import DriveInterrupted, claim_to_settle
from ..tools import Probe, ProbeVerdict, Tool, ToolCall, ToolFailed
from ._flow_server import probe_request
from ._mcp_live import RUN_ENDED, LiveServer
from ._mcp_record import LaneRecord
from ._mcp_replay import LaneCall, error_answer, lane_probe, lane_tool
from ._salvor_writes import lane_write_probe


async def probe_open_write(lane: LaneRecord, request_id: Any, call: LaneCall) -> dict | None:
    """Probe the open write ``call`` (the drive starts at a run parked on it only when it has
    a probe, ``probed_write``) while the agent waits on it: a file write of the ``salvor``
    lane by the agent's ``file_holds`` (``_salvor_writes``), another by its server's.

    The probe is a read the daemon sends the same server over this lane's own live session
    (started, or dialled, from the operator's declaration exactly as a forwarded call is,
    initialised with the lane's recorded ``initialize``): no origin the operator did not
    declare is contacted, no secret goes anywhere a forwarded call's does not, and the
    probe's exchange is not one of the lane's calls (it is kept as the probe's answer,
    ``RunContext.probe_write``). Landed: the write's completion is recorded with the
    answer's ``output`` as an MCP tool result (``settled_by: "probe"``, settling its
    claim) and the agent is answered with it. Did not land: None, and the caller performs
    the write again under its recorded key, once. Cannot tell: the run stays parked and
    the agent is stopped.
    """
    ctx, proxy = lane.ctx, lane.proxy
    found = lane_write_probe(lane.in_process, call.input) or declared_probe(
        lane.spec, lane.live, call
    )
    if found is None:
        return error_answer(
            request_id,
            RUN_ENDED,
            f"{lane.replay.names.one} {lane.replay.position + 1} (recorded at seq {call.seq}) "
            "is an open write its server declares no probe for; a person records what it did",
        )
    probe, reader, write_input = found
    try:
        verdict, output, evidence = await ctx.probe_write(probe, reader, write_input, call.seq)
    except DriveInterrupted as exc:
        # The probe was not sent: this node may no longer act on the run (``LiveServer.perform``).
        proxy.interrupt(exc)
        return error_answer(request_id, RUN_ENDED, f"{exc.message}; this agent process is stopped")
    if verdict is ProbeVerdict.NOT_LANDED:
        return None
    if verdict is not ProbeVerdict.LANDED:
        proxy.rested.set()
        return error_answer(
            request_id,
            RUN_ENDED,
            f"the probe {probe.tool} could not tell whether the write at seq {call.seq} "
            f"landed; run {proxy.run_id} waits for a person to record what happened",
        )
    answer = {"result": probed_result(output)}
    settle = await claim_to_settle(ctx.access, proxy.run_id, call.seq, call.idempotency_key)
    with trio.CancelScope(shield=True):
        await ctx.record(
            ToolCallCompleted(seq=call.seq, output=answer, settled_by=Actor.PROBE, probe=evidence),
            settle=settle,
        )
    call.output, call.completed = answer, True
    lane.replay.advance()
    lane.outbox = []
    return await lane.answer(request_id, call)


def declared_probe(
    spec: McpServerSpec, live: LiveServer, call: LaneCall
) -> tuple[Probe, Tool, Any] | None:
    """The probe ``spec``'s server declares for the open write ``call``, the read that asks it
    over the lane's live session, and the input it reads from; or None."""
    probe = lane_probe([spec], lane_tool(spec.name, call.method), call.input)
    if probe is None:
        return None

    async def ask(arguments: Any, attempt: ToolCall) -> Any:
        try:
            result = await probe_request(await live.session(), probe.tool, arguments, attempt)
        except McpRemoteError as exc:
            raise ToolFailed(exc.message, retryable=False) from None
        except (McpNoAnswer, McpUnavailable) as exc:
            raise ToolFailed(exc.message) from None
        return probe_answer(spec.name, probe.tool, result)

    reader = Tool(
        name=probe.tool,
        description=f"The probe {probe.tool} of MCP server {spec.name}.",
        effect=Effect.READ,
        input_schema={},
        handler=ask,
        mcp_server=spec.name,
    )
    return probe, reader, call.input.get("arguments")


def probed_result(output: Any) -> dict:
    """The MCP tool result an agent is answered with for a write its probe found landed: the
    probe's ``output`` when it is one (it has ``content``), else that value as JSON text."""
    if isinstance(output, dict) and isinstance(output.get("content"), list):
        return output
    return {"content": [{"type": "text", "text": json.dumps(output)}]}
