"""The built-in agent loop: a definition (pure data) driven through a RunContext.

The loop is deterministic given its log: the conversation, every request and
every budget decision are rebuilt from recorded events, so re-running it from
the top replays the recorded prefix exactly and continues live from the end.

A call of a tool that names key fields (a native tool's ``idempotency_keys``,
an MCP server's ``idempotency_keys`` table) is one identity across every run
(``RunContext.tool_call``): a second call of it copies the first's outcome
and performs nothing. Meeting that identity while another run's call of it is
still open, the loop waits for it (bounded, cancellable) and copies what it
recorded; still open past the bound, the drive stops with ``CallInFlight``
and nothing of the call written (the model's answer asking for it is kept),
and the daemon's driving set drives the run again once the holder settles (``ClaimWaits``),
or a resume does. It never performs the call beside the open one: a run never charges a card
twice.

A write that declares a probe (a native tool's ``probe``, an MCP server's
``probes`` table) is handed its read with every call, so a write found open,
or one whose outcome its handler could not learn, is probed before the run
parks for a person; and a run parked on such a write is driven again
(``probes_open_write``), which is how recovery reaches it.

Flow tools (``salvor.daemon.flows``) are offered beside the registry's and the MCP servers' as the
run's ``FlowSession`` allows: ``ask_user``, ``subagent`` and the read and authoring tools go
through ``RunContext.tool_call`` like any tool (a question's suspension parks the run, and the
answer comes back as the call's result); ``finish`` is the loop's own, like ``submit_output``: a
good one ends the conversation with its result as the output, and nothing after it in the same
response is performed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from salvor.protocol import (
    BUDGET_KINDS,
    EDIT_MODE_TOOLS,
    BudgetExceeded,
    EventKind,
    FlowTool,
    ReplayDivergence,
    RunCompleted,
    RunFailed,
    RunState,
    SchemaViolation,
    Session,
    check_finish,
    text_result,
    validate,
)

from ..files import file_tools
from ..flows import (
    FlowSession,
    flow_tools,
)
from ..mcp import (
    McpBuildError,
    McpConnections,
    McpServerSpec,
    exposed_tools,
    listing_tool,
    mcp_tool,
    probe_reader,
)
from ..models import ModelGateway
from ..recording import DriveInterrupted, RunContext
from ..tools import WRITE_TOOLS, Tool, ToolRegistry
from ..web import off_loop
from ._attachments import take_attachments
from ._definition import AgentDefinition
from ._file_calls import file_change
from ._skill_calls import take_skills
from ._tool_answers import (
    as_text,
    attached_by,
    counted_child,
    error_result,
    text_of,
    tool_result,
)

SUBMIT_OUTPUT = "submit_output"
FINISH = FlowTool.FINISH.value
# What a child session that must finish is told when it answers in text instead, and how often:
# past the bound the run fails rather than loop on a model that never calls it.
FINISH_REMINDER = (
    "You answered without calling `finish`. Call `finish` now with your status, a summary and "
    "your declared outputs; nothing else ends this task."
)
FINISH_REMINDERS = 2
# What ``_text_answer`` gives when the agent is to be reminded instead of answered.
_REMINDED: Any = object()
# What ``_ending`` gives for a call that does not end the conversation.
_NOT_AN_END: Any = object()


def offered_besides_mcp(agent: AgentDefinition) -> dict[str, str]:
    """The tool names an agent offers besides its MCP tools, each with what offers it."""
    taken = {name: f"the registry tool {name!r}" for name in agent.tools}
    if agent.output_schema is not None:
        taken[SUBMIT_OUTPUT] = f"the {SUBMIT_OUTPUT} tool of output_schema"
    taken |= {tool.value: f"the flow tool {tool.value!r}" for tool in agent.offerable_flow_tools}
    return taken


class AgentLoop:
    """Drives one built-in agent run from its log to its next resting point."""

    def __init__(
        self,
        agent: AgentDefinition,
        registry: ToolRegistry,
        gateway: ModelGateway,
        mcp: McpConnections | None = None,
        flows: FlowSession | None = None,
        mark: Mapping[str, str] | None = None,
        attachable_mcp: Mapping[str, McpServerSpec] | None = None,
    ) -> None:
        """``mark``: the orphan marks of the run's children (its MCP servers', its commands').
        ``attachable_mcp``: what an MCP server attached to the run at run time reaches, by
        name (the operator's ``--attachable-mcp``; ``take_attachments``)."""
        self.agent = agent
        self.gateway = gateway
        self.mcp = mcp
        self.flows = flows
        # A registry tool by its name, else the file tool (``files``: built over the workspace
        # and the agent's access, each drive); the prompt gains its skills in ``take_skills``.
        self.registry, self.mark, self.system_prompt = registry, mark, agent.system_prompt
        self.files = file_tools(registry.workspace, agent.access, agent.tools, mark)
        self.tools = {
            name: registry.get(name) or self.files.tools.get(name) for name in agent.tools
        }
        # Write tool name -> the read that probes it.
        self.probes: dict[str, Tool] = {
            name: self._probe_of(registry, name, tool)
            for name, tool in self.tools.items()
            if tool.probe
        }
        self.mcp_names: set[str] = set()
        self.tool_specs = [tool.spec() for tool in self.tools.values()]
        # The flow tools offered now (finish aside: the loop answers it itself), and the edit
        # mode they were built for (None until the first build).
        self.flow_tools: dict[str, Tool] = {}
        self.edit_mode: bool | None = None
        self.finish_spec: dict | None = None
        # The tools attached to the run's tree at run time that this conversation knows of, and
        # those its own attach_tool calls attached (read from their recorded answers).
        self.attached: tuple[str, ...] = ()
        self.self_attached: list[str] = []
        self.attachable_mcp = attachable_mcp or {}
        # The attached MCP servers already listed and offered.
        self.attached_servers: set[str] = set()

    def _probe_of(self, registry: ToolRegistry, name: str, tool: Tool) -> Tool | None:
        if self.files.tools.get(name) is tool:
            return self.files.prober
        return registry.probe_of(tool)

    def _changes_a_file(self, name: str, tool: Tool) -> bool:
        return name in WRITE_TOOLS and self.files.tools.get(name) is tool

    @property
    def finishes(self) -> bool:
        """Whether this conversation ends with a ``finish`` call (a child session offered it)."""
        return self.finish_spec is not None

    @property
    def must_finish(self) -> bool:
        """Whether a text answer cannot stand for the finish (required outputs, or a branch)."""
        flows = self.flows
        return self.finishes and (
            flows.branches is not None or any(output.required for output in flows.outputs)
        )

    @property
    def watches_edit_mode(self) -> bool:
        """Whether the edit mode decides what this conversation is offered (a main session, or
        any session of a linked run tree, of an agent that opted into an authoring tool, with a
        host to ask)."""
        flows = self.flows
        return (
            flows is not None
            and flows.host is not None
            and (flows.session is Session.MAIN or flows.linked)
            and any(tool in EDIT_MODE_TOOLS for tool in flows.opted_in)
        )

    def _offer_flow_tools(self, edit_mode: bool) -> None:
        """Build the flow tools the session sees with ``edit_mode``; finish is only a spec."""
        self.edit_mode = edit_mode
        self.flow_tools, self.finish_spec = {}, None
        if self.flows is None:
            return
        for tool in flow_tools(self.flows, edit_mode=edit_mode):
            if tool.name == FINISH:
                self.finish_spec = tool.spec()
            else:
                self.flow_tools[tool.name] = tool

    def _flow_specs(self) -> list[dict]:
        specs = [tool.spec() for tool in self.flow_tools.values()]
        return specs + ([self.finish_spec] if self.finish_spec is not None else [])

    def _submit_spec(self) -> list[dict]:
        if self.agent.output_schema is None:
            return []
        return [
            {
                "name": SUBMIT_OUTPUT,
                "description": (
                    "Submit the final answer. Its input must match the required output shape."
                ),
                "input_schema": self.agent.output_schema,
            }
        ]

    async def _add_mcp_tools(self, ctx: RunContext) -> None:
        """List each MCP server's tools through the log (a recorded
        read) and offer the exposed ones.

        A listing that no longer has what the definition names fails the run:
        the same check registration made, now against what the run was given.
        """
        listings = {}
        for spec in self.agent.mcp_servers:
            listed = await ctx.tool_call(listing_tool(spec, self.mcp), {})
            if not (isinstance(listed, dict) and isinstance(listed.get("tools"), list)):
                await ctx.control(
                    RunFailed(
                        error=(
                            "the recorded tool listing of MCP server "
                            f"{spec.name!r} is not a list of tools"
                        )
                    )
                )
                await ctx.park(RunState.FAILED)
            listings[spec.name] = listed["tools"]
        try:
            exposed = exposed_tools(
                self.agent.mcp_servers, listings, offered_besides_mcp(self.agent)
            )
        except McpBuildError as exc:
            await ctx.control(RunFailed(error=f"the agent's MCP tools no longer build: {exc}"))
            await ctx.park(RunState.FAILED)
        for spec, entry in exposed:
            tool, model_spec = mcp_tool(spec, entry, self.mcp)
            self.tools[tool.name] = tool
            if tool.probe is not None:
                self.probes[tool.name] = probe_reader(spec, tool.probe.tool, self.mcp)
            self.mcp_names.add(tool.name)
            self.tool_specs.append(model_spec)

    def _request(self, messages: list[dict]) -> dict:
        request: dict[str, Any] = {
            "model": self.agent.model,
            "max_tokens": self.agent.max_response_tokens,
        }
        if self.system_prompt:
            request["system"] = self.system_prompt
        request["messages"] = messages
        tools = self.tool_specs + self._flow_specs() + self._submit_spec()
        if tools:
            request["tools"] = tools
        return request

    def _cost(self, input_tokens: int, output_tokens: int) -> float:
        pricing = self.agent.pricing or {"input_per_mtok": 0, "output_per_mtok": 0}
        return (
            input_tokens * pricing["input_per_mtok"] + output_tokens * pricing["output_per_mtok"]
        ) / 1e6

    async def run(self, ctx: RunContext) -> None:
        """Drive until the run rests. Raises Parked at every resting point."""
        head = ctx.cursor.take(EventKind.RUN_STARTED)
        if head is None:
            raise DriveInterrupted(f"run {ctx.run_id} has no RunStarted head")
        output = await self.converse(ctx, head.event.input)
        await ctx.control(RunCompleted(output=output))
        await ctx.park(RunState.COMPLETED)

    async def converse(
        self, ctx: RunContext, task: Any, *, call_key: Callable[[int, str], str] | None = None
    ) -> Any:
        """Hold the agent's conversation about ``task`` in ``ctx``'s log; return its final output.

        The caller records how the output ends the conversation: ``run`` with RunCompleted, a
        graph's agent node with NodeExited. Budgets count this conversation's calls only (a graph
        run's agent nodes each start from zero); a crossing parks the run as in an agent run.

        ``call_key(index, tool)``: the key the conversation's tool call number ``index``
        (0-based, every call the model asks for that reaches a tool) presents when it is an
        ``idempotent`` call without key fields (``RunContext.tool_call``); None: its position's
        derived key. A graph's agent node passes ``graph_call_key``, so a fork presents the
        keys its origin recorded.

        Raises:
            Parked: the run rests before there is an output (a budget, a gate,
                a write to reconcile, or a RunFailed the log already holds).
        """
        await self._take_tools(ctx)
        messages: list[dict] = [
            {"role": "user", "content": [{"type": "text", "text": as_text(task)}]}
        ]
        usage = {"input_tokens": 0, "output_tokens": 0}
        completed_calls = 0
        started_at = await ctx.now() if "wall_time_seconds" in self.agent.budgets else None
        budget_extensions: dict[str, float] = {}
        calls = 0
        reminders = 0
        while True:
            await self._check_budgets(ctx, usage, completed_calls, started_at, budget_extensions)
            response, call_usage = await self._model_call(ctx, messages)
            completed_calls += 1
            usage["input_tokens"] += call_usage["input_tokens"]
            usage["output_tokens"] += call_usage["output_tokens"]
            content = response.get("content") or []
            messages.append({"role": "assistant", "content": content})
            uses = [block for block in content if block.get("type") == "tool_use"]
            if not uses:
                answer = await self._text_answer(ctx, content, reminders)
                if answer is not _REMINDED:
                    return answer
                reminders += 1
                messages.append(
                    {"role": "user", "content": [{"type": "text", "text": FINISH_REMINDER}]}
                )
                continue
            results = []
            for use in uses:
                name, use_id, args = use.get("name"), use.get("id"), use.get("input")
                output, refused = await self._ending(name, args)
                if refused is not None:
                    results.append(error_result(use_id, refused))
                    continue
                if output is not _NOT_AN_END:
                    return output
                tool = self.tools.get(name) or self.flow_tools.get(name)
                if tool is None:
                    results.append(
                        error_result(use_id, f"there is no tool named {name!r} in this agent")
                    )
                    continue
                key = call_key(calls, name) if call_key is not None else None
                calls += 1
                value, steps = await self._perform(ctx, name, tool, args, key, usage)
                completed_calls += steps
                results.append(tool_result(use_id, value, mcp=name in self.mcp_names))
            messages.append({"role": "user", "content": results})

    async def _take_tools(self, ctx: RunContext) -> None:
        """The tools a conversation starts with beyond the definition's registry tools: its
        skills (a recorded read), its MCP servers' (a recorded listing), the flow tools."""
        if self.agent.skills:
            await take_skills(self, ctx)
        if self.agent.mcp_servers:
            await self._add_mcp_tools(ctx)
        self._offer_flow_tools(False)

    async def _perform(
        self, ctx: RunContext, name: str, tool: Any, args: Any, key: str | None, usage: dict
    ) -> tuple[Any, int]:
        """One tool call the model asked for, performed or answered from the log: its value,
        and the model calls it counts beyond this conversation's (a subagent child's, whose
        tokens join ``usage``)."""
        if self._changes_a_file(name, tool):
            value = await file_change(ctx, self.files, tool, args)
        else:
            value = await ctx.tool_call(tool, args, probe=self.probes.get(name), key=key)
        if name == FlowTool.SUBAGENT:
            return counted_child(value, usage)
        if name == FlowTool.ATTACH_TOOL:
            self.self_attached.extend(attached_by(value))
        return value, 0

    async def _ending(self, name: Any, args: Any) -> tuple[Any, str | None]:
        """What a call of ``submit_output`` or ``finish`` does: (its output, None) when it ends
        the conversation; (``_NOT_AN_END``, why) when it does not pass, which the model is told
        and nothing is recorded (only a good end counts); (``_NOT_AN_END``, None) for any other
        tool."""
        try:
            if name == SUBMIT_OUTPUT and self.agent.output_schema is not None:
                schema = self.agent.output_schema
                await off_loop(partial(validate, schema, args, what="the submitted output"))
                return args, None
            if name == FINISH and self.finishes:
                return check_finish(args, self.flows.outputs, self.flows.branches), None
        except SchemaViolation as exc:
            return _NOT_AN_END, exc.message
        return _NOT_AN_END, None

    async def _text_answer(self, ctx: RunContext, content: list, reminders: int) -> Any:
        """What a response without a tool call gives: the conversation's output, or
        ``_REMINDED`` when a child that must finish is to be told to (``reminders`` so far).

        Raises:
            Parked: the reminders are spent (RunFailed is recorded), or the text holds no
                output matching output_schema.
        """
        if not self.finishes:
            return await self._answer_from_text(ctx, content)
        if not self.must_finish:
            return text_result(text_of(content))
        if reminders == FINISH_REMINDERS:
            await ctx.control(
                RunFailed(
                    error=(
                        f"the agent answered in text {reminders + 1} times without calling "
                        "finish, which its declared outputs (or the branch it must choose) need"
                    )
                )
            )
            await ctx.park(RunState.FAILED)
        return _REMINDED

    async def _model_call(self, ctx: RunContext, messages: list[dict]) -> tuple[dict, dict]:
        """The next model call, offered the tools the session sees now.

        A main session watching the edit mode asks the host before a live call and rebuilds its
        flow tools when the answer changed. In replay the recorded request decides: a call
        recorded while the mode stood otherwise is matched with the other tool set (the request
        hash names which it offered), so a change made since never diverges the replay.

        Raises:
            ReplayDivergence: the recorded call matches neither tool set.
        """
        if await take_attachments(self, ctx) and self.flows is not None:
            # A child this conversation starts from now on inherits them.
            self.flows = replace(self.flows, attached=self.attached)
            if self.edit_mode is not None:
                self._offer_flow_tools(self.edit_mode)
        if self.watches_edit_mode and ctx.live:
            edit_mode = await self.flows.host.edit_mode()
            if edit_mode != self.edit_mode:
                self._offer_flow_tools(edit_mode)
        try:
            return await self._call_model(ctx, messages)
        except ReplayDivergence as first:
            if not self.watches_edit_mode or ctx.live:
                raise
            self._offer_flow_tools(not self.edit_mode)
            try:
                return await self._call_model(ctx, messages)
            except ReplayDivergence:
                raise first from None

    async def _call_model(self, ctx: RunContext, messages: list[dict]) -> tuple[dict, dict]:
        return await ctx.model_call(
            self.gateway, self._request(list(messages)), record_prompts=self.agent.record_prompts
        )

    async def _check_budgets(
        self, ctx: RunContext, usage: dict, completed_calls: int, started_at, extensions: dict
    ) -> None:
        """Record BudgetExceeded and park when a budget is crossed; an extension lifts it."""
        budgets = self.agent.budgets
        while True:
            crossed = None
            for kind in BUDGET_KINDS:
                if kind not in budgets:
                    continue
                limit = budgets[kind] + extensions.get(kind, 0)
                if kind == "steps":
                    observed = completed_calls
                elif kind == "tokens":
                    observed = usage["input_tokens"] + usage["output_tokens"]
                elif kind == "cost_usd":
                    observed = round(self._cost(usage["input_tokens"], usage["output_tokens"]), 6)
                else:
                    observed = round((await ctx.now() - started_at).total_seconds(), 3)
                if observed >= limit:
                    crossed = (kind, limit, observed)
                    break
            if crossed is None:
                return
            kind, limit, observed = crossed
            await ctx.control(
                BudgetExceeded(budget={"kind": kind, "limit": limit}, observed=observed)
            )
            extension = await ctx.await_resume(RunState.BUDGET_EXCEEDED)
            extensions[kind] = extensions.get(kind, 0) + extension["extend_by"]

    async def _answer_from_text(self, ctx: RunContext, content: list) -> Any:
        """The output a text answer gives: the text, or (with output_schema) the JSON it holds.

        Raises:
            Parked: the text holds no output matching output_schema; RunFailed is recorded.
        """
        text = text_of(content)
        if self.agent.output_schema is None:
            return text
        try:
            answer = json.loads(text)
            await off_loop(partial(validate, self.agent.output_schema, answer, what="the answer"))
        except (ValueError, SchemaViolation) as exc:
            await ctx.control(
                RunFailed(
                    error=f"the model answered without an output matching output_schema: {exc}"
                )
            )
            await ctx.park(RunState.FAILED)
        return answer
