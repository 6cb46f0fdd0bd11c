"""The flow tools as ``Tool``s: one implementation, offered to a built-in agent's loop, to a graph
agent node, and (as the ``salvor`` MCP server) to a process agent.

``ask_user`` parks the run on a suspension whose ``input_schema`` is the question's answer shape,
so the resume input (``{"answer": ...}``) is the call's result. ``finish`` checks its input
against the agent's declared outputs and returns the result a run records. ``subagent`` and the
read and authoring tools ask the session's host.
"""

from __future__ import annotations

from typing import Any

from salvor.protocol import (
    FINISH_DESCRIPTION,
    TOOL_SHAPES,
    BadQuestion,
    Effect,
    FlowTool,
    SchemaViolation,
    Session,
    check_finish,
    finish_schema,
    offered_flow_tools,
    question_schema,
)

from ..tools import Suspend, Tool, ToolCall, ToolFailed
from ._session import FlowSession

# The tools a host must stand behind (without one they are not offered).
_NEED_HOST = frozenset(
    {
        FlowTool.SUBAGENT,
        FlowTool.FLOW_RESULTS,
        FlowTool.FLOW_AGENTS,
        FlowTool.FLOW_WRITE,
        FlowTool.ATTACH_TOOL,
    }
)
# Effects: a question and a finish are reads (asking again after a crash asks the same thing);
# a subagent call finds its one child again (idempotent); registering is content-addressed.
_EFFECTS = {
    FlowTool.ASK_USER: Effect.READ,
    FlowTool.SUBAGENT: Effect.IDEMPOTENT,
    FlowTool.FINISH: Effect.READ,
    FlowTool.FLOW_RESULTS: Effect.READ,
    FlowTool.FLOW_AGENTS: Effect.IDEMPOTENT,
    FlowTool.FLOW_WRITE: Effect.IDEMPOTENT,
    # Attaching only names tools; the recorded answer is the attachment, so asking again after a
    # crash attaches the same names.
    FlowTool.ATTACH_TOOL: Effect.IDEMPOTENT,
}
AUTONOMOUS_REFUSAL = (
    "ask_user is not available here: this run is part of an autonomous run, and nobody will "
    "answer; decide on your own and say what you assumed"
)


def offered(session: FlowSession, *, edit_mode: bool) -> list[FlowTool]:
    """The flow tools ``session`` sees now (the matrix, the opt-in, edit mode, a host)."""
    tools = offered_flow_tools(
        session.opted_in, session.session, edit_mode=edit_mode, linked=session.linked
    )
    return [tool for tool in tools if session.host is not None or tool not in _NEED_HOST]


def flow_tools(session: FlowSession, *, edit_mode: bool) -> list[Tool]:
    """The ``Tool``s ``session`` is offered now, in ``FlowTool`` order."""
    return [flow_tool(session, name) for name in offered(session, edit_mode=edit_mode)]


def flow_tool(session: FlowSession, name: FlowTool) -> Tool:
    """One flow tool bound to ``session`` (whether the session is offered it is ``offered``'s)."""
    if name is FlowTool.FINISH:
        description = FINISH_DESCRIPTION
        schema = finish_schema(session.outputs, session.branches)
    else:
        description, schema = TOOL_SHAPES[name]
    return Tool(
        name=name.value,
        description=description,
        effect=_EFFECTS[name],
        input_schema=schema,
        handler=_HANDLERS[name](session),
    )


def _ask_user(session: FlowSession):
    async def ask(args: Any, call: ToolCall) -> Suspend:
        if session.autonomous and session.session is Session.CHILD:
            raise ToolFailed(AUTONOMOUS_REFUSAL, retryable=False)
        try:
            schema = question_schema(args)
        except BadQuestion as exc:
            raise ToolFailed(str(exc), retryable=False) from None
        return Suspend(reason=args["question"], input_schema=schema)

    return ask


def _finish(session: FlowSession):
    async def finish(args: Any, call: ToolCall) -> dict:
        try:
            return check_finish(args, session.outputs, session.branches)
        except SchemaViolation as exc:
            raise ToolFailed(exc.message, retryable=False) from None

    return finish


def _host(session: FlowSession):
    if session.host is None:
        raise ToolFailed("no daemon stands behind this run to carry that out", retryable=False)
    return session.host


def _subagent(session: FlowSession):
    async def subagent(args: Any, call: ToolCall) -> dict:
        return await _host(session).run_child(
            session, call.seq, args["agent"], args["task"], args.get("inputs") or {}
        )

    return subagent


def _flow_results(session: FlowSession):
    async def flow_results(args: Any, call: ToolCall) -> Any:
        return await _host(session).flow_results(session, args)

    return flow_results


def _flow_agents(session: FlowSession):
    async def flow_agents(args: Any, call: ToolCall) -> Any:
        host = _host(session)
        if args["op"] == "list":
            return await host.agent_catalog()
        if "content" not in args:
            raise ToolFailed("op `write` needs the agent file as `content`", retryable=False)
        if session.linked:  # the file is saved on the client, never registered here
            return await host.save_agent(session, args["content"])
        return await host.write_agent(args["content"], author=session.run_id)

    return flow_agents


def _flow_write(session: FlowSession):
    async def flow_write(args: Any, call: ToolCall) -> dict:
        namespace = args.get("namespace") or "custom"
        if session.linked:  # the file is saved on the client, never stored here
            return await _host(session).save_graph(
                session, namespace, args["name"], args["content"]
            )
        return await _host(session).write_graph(
            namespace, args["name"], args["content"], author=session.run_id
        )

    return flow_write


def _attach_tool(session: FlowSession):
    async def attach_tool(args: Any, call: ToolCall) -> dict:
        return await _host(session).attach_tools(session, list(dict.fromkeys(args["tools"])))

    return attach_tool


_HANDLERS = {
    FlowTool.ASK_USER: _ask_user,
    FlowTool.SUBAGENT: _subagent,
    FlowTool.FINISH: _finish,
    FlowTool.FLOW_RESULTS: _flow_results,
    FlowTool.FLOW_AGENTS: _flow_agents,
    FlowTool.FLOW_WRITE: _flow_write,
    FlowTool.ATTACH_TOOL: _attach_tool,
}
