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
    TOOL_ERROR_KEY,
    BudgetExceeded,
    Envelope,
    EventKind,
    FlowTool,
    ReplayDivergence,
    RunCompleted,
    RunFailed,
    RunState,
    RunView,
    SchemaViolation,
    Session,
    check_finish,
    text_result,
    validate,
)

from ..files import file_tools
from ..flows import (
    FlowHost,
    FlowSession,
    client_project,
    flow_tools,
    is_autonomous,
    session_of,
    tree_tools,
)
from ..mcp import (
    McpBuildError,
    McpConnections,
    exposed_tools,
    listing_tool,
    mcp_result_for_model,
    mcp_tool,
    open_connections,
    probe_reader,
)
from ..models import ModelClients, ModelGateway
from ..processes import MARK_VAR, RUN_VAR, store_fingerprint
from ..proxies import lane_probe
from ..recording import DriveInterrupted, Parked, RunContext
from ..tools import WRITE_TOOLS, Tool, ToolRegistry
from ..web import off_loop
from ._credentials import Credentials, Undeclared
from ._definition import AgentDefinition, AgentKind
from ._drive_kit import DriveKit
from ._file_calls import file_change
from ._process import drive_process, parked_write
from ._service import drive_service

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


def flow_session(
    agent: AgentDefinition,
    run_id: str,
    labels: dict[str, str] | None,
    host: FlowHost | None,
    *,
    graph_node: bool = False,
    branches: list[str] | None = None,
) -> FlowSession:
    """The flow session a conversation of ``agent`` in run ``run_id`` holds.

    In a child session ``finish`` is offered when the agent opted into it, declares outputs, or
    must choose a branch (``branches``: a graph node a branch node routes on): a child must be
    able to return its typed result.
    """
    session = session_of(labels, graph_node=graph_node)
    chosen = agent.flow_tools
    outputs = agent.outputs
    if (
        session is Session.CHILD
        and FlowTool.FINISH not in chosen
        and (outputs or branches is not None)
    ):
        chosen += (FlowTool.FINISH,)
    return FlowSession(
        run_id=run_id,
        session=session,
        autonomous=is_autonomous(labels),
        opted_in=chosen,
        outputs=outputs,
        branches=branches,
        host=host,
        client_project=client_project(labels),
    )


def _as_text(value: Any) -> str:
    return (
        value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    )


def _tool_result(use_id: str, value: Any, *, mcp: bool = False) -> dict:
    if isinstance(value, dict) and TOOL_ERROR_KEY in value:
        return {
            "type": "tool_result",
            "tool_use_id": use_id,
            "content": value[TOOL_ERROR_KEY]["message"],
            "is_error": True,
        }
    if mcp:
        text, is_error = mcp_result_for_model(value)
        return {
            "type": "tool_result",
            "tool_use_id": use_id,
            "content": text,
            **({"is_error": True} if is_error else {}),
        }
    return {"type": "tool_result", "tool_use_id": use_id, "content": _as_text(value)}


def _text_of(content: list) -> str:
    return "".join(block.get("text", "") for block in content if block.get("type") == "text")


def _counted_child(value: Any, usage: dict) -> tuple[Any, int]:
    """A subagent call's output less the child's usage it carries, which is added to ``usage``;
    and the child's model calls. The child's calls count toward this conversation's budgets as
    the call's output recorded them, so a replay counts the same."""
    child = value.get("usage") if isinstance(value, dict) else None
    keys = ("input_tokens", "output_tokens", "steps")
    if not (isinstance(child, dict) and all(type(child.get(key)) is int for key in keys)):
        return value, 0
    usage["input_tokens"] += child["input_tokens"]
    usage["output_tokens"] += child["output_tokens"]
    return {k: v for k, v in value.items() if k != "usage"}, child["steps"]


def _attached_by(value: Any) -> list[str]:
    """The names an ``attach_tool`` call's recorded answer attached (none for an error)."""
    names = value.get("attached") if isinstance(value, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _error_result(use_id: str, message: str) -> dict:
    return {"type": "tool_result", "tool_use_id": use_id, "content": message, "is_error": True}


def offered_besides_mcp(agent: AgentDefinition) -> dict[str, str]:
    """The tool names an agent offers besides its MCP tools, each with what offers it."""
    taken = {name: f"the registry tool {name!r}" for name in agent.tools}
    if agent.output_schema is not None:
        taken[SUBMIT_OUTPUT] = f"the {SUBMIT_OUTPUT} tool of output_schema"
    taken |= {tool.value: f"the flow tool {tool.value!r}" for tool in agent.offerable_flow_tools}
    return taken


def reach_refusal(agent: AgentDefinition, credentials: Credentials | None) -> str | None:
    """Why the daemon may not drive ``agent`` with the operator's declarations as they are now
    (``Credentials.check_reach``: a definition stored before the flags changed is held to
    today's); None when it may, or outside the daemon (the command line trusts its files)."""
    if credentials is None or not credentials.strict:
        return None
    try:
        credentials.check_reach(agent)
    except Undeclared as exc:
        return f"the run's agent names what this daemon's operator has not declared: {exc}"
    return None


async def fail_unreachable(ctx: RunContext, refusal: str) -> RunView:
    """Fail the run of ``ctx`` with ``refusal`` (``reach_refusal``) instead of driving it.

    A run with nothing to drive is left as it is, one parked on a write that may have landed
    among them (a person settles it, and the next drive fails the run; its probe is not run,
    since that would dial what the refusal forbids). A sleeping run is woken when its timer
    is due, then failed; before then, left asleep.
    """
    if ctx.view.state is RunState.SLEEPING and not await ctx.wake_when_due():
        return ctx.view
    if ctx.view.idle:
        return ctx.view
    await ctx.record(RunFailed(error=refusal))
    return ctx.view


def gateway_for(
    agent: AgentDefinition,
    credentials: Credentials | None = None,
    clients: ModelClients | None = None,
) -> ModelGateway:
    """The model gateway a definition asks for, with the key bound to the endpoint it reaches.

    ``credentials``: the daemon's declarations; None resolves an agent file
    as the command line always has (from the process's environment).
    ``clients``: the daemon's HTTP clients kept between drives (None: one of its own).
    """
    endpoint = (credentials or Credentials()).endpoint_for(
        provider=agent.llm.provider,
        base_url=agent.llm.base_url,
        base_url_env=agent.llm.base_url_env,
        api_key_env=agent.llm.api_key_env,
    )
    return ModelGateway(
        endpoint,
        stream=agent.llm.stream,
        max_retries=agent.llm.max_retries,
        timeout_seconds=agent.llm.timeout_seconds,
        clients=clients,
    )


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
    ) -> None:
        """``mark``: the orphan marks of the run's children (its MCP servers', its commands')."""
        self.agent = agent
        self.gateway = gateway
        self.mcp = mcp
        self.flows = flows
        # A registry tool by its name, else the file tool (``files``: built over the workspace
        # and the agent's access, each drive).
        self.registry = registry
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

    def _take_attachments(self, ctx: RunContext) -> None:
        """Offer the registry tools attached to the run's tree so far: those its head inherited,
        the ``ToolsAttached`` the replay cursor has passed (in replay: those recorded before
        this point of the log, so a replay offers what the recorded call offered), and this
        conversation's own ``attach_tool`` answers. A name something else offers already, or
        the registry no longer has, is not offered again."""
        ctx.live  # noqa: B018 (the cursor passes the attachments standing before the next call)
        names = tree_tools(ctx.view.labels, [*ctx.cursor.attached, *self.self_attached])
        if names == self.attached:
            return
        self.attached = names
        taken = {SUBMIT_OUTPUT, FINISH, *self.flow_tools, *(tool.value for tool in FlowTool)}
        for name in names:
            tool = self.registry.get(name)
            if tool is None or name in self.tools or name in taken:
                continue
            self.tools[name] = tool
            if tool.probe:
                self.probes[name] = self.registry.probe_of(tool)
            self.tool_specs.append(tool.spec())
        if self.flows is not None:
            # A child this conversation starts from now on inherits them.
            self.flows = replace(self.flows, attached=names)
            if self.edit_mode is not None:
                self._offer_flow_tools(self.edit_mode)

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
        if self.agent.system_prompt:
            request["system"] = self.agent.system_prompt
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
        if self.agent.mcp_servers:
            await self._add_mcp_tools(ctx)
        self._offer_flow_tools(False)
        messages: list[dict] = [
            {"role": "user", "content": [{"type": "text", "text": _as_text(task)}]}
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
                if name == SUBMIT_OUTPUT and self.agent.output_schema is not None:
                    try:
                        await off_loop(
                            partial(
                                validate,
                                self.agent.output_schema,
                                args,
                                what="the submitted output",
                            )
                        )
                    except SchemaViolation as exc:
                        results.append(_error_result(use_id, exc.message))
                        continue
                    return args
                if name == FINISH and self.finishes:
                    try:
                        return check_finish(args, self.flows.outputs, self.flows.branches)
                    except SchemaViolation as exc:
                        # Told to the model, never recorded as a call: only a good finish counts.
                        results.append(_error_result(use_id, exc.message))
                        continue
                tool = self.tools.get(name) or self.flow_tools.get(name)
                if tool is None:
                    results.append(
                        _error_result(use_id, f"there is no tool named {name!r} in this agent")
                    )
                    continue
                key = call_key(calls, name) if call_key is not None else None
                calls += 1
                if self._changes_a_file(name, tool):
                    value = await file_change(ctx, self.files, tool, args)
                else:
                    value = await ctx.tool_call(tool, args, probe=self.probes.get(name), key=key)
                if name == FlowTool.SUBAGENT:
                    value, steps = _counted_child(value, usage)
                    completed_calls += steps
                elif name == FlowTool.ATTACH_TOOL:
                    self.self_attached.extend(_attached_by(value))
                results.append(_tool_result(use_id, value, mcp=name in self.mcp_names))
            messages.append({"role": "user", "content": results})

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
            return text_result(_text_of(content))
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
        self._take_attachments(ctx)
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
        text = _text_of(content)
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


def probes_open_write(agent: AgentDefinition, registry: ToolRegistry, view: RunView) -> bool:
    """Whether ``view`` is parked on an open write of ``agent`` that declares a probe.

    Such a run is not only a person's to settle: a drive probes the write
    first (a process agent's, over the server's stand-in lane: ``McpLane``).
    A service agent's writes are never probed.
    """
    pending = parked_write(view)
    return pending is not None and declares_probe(agent, registry, pending.tool, pending.input)


def declares_probe(
    agent: AgentDefinition, registry: ToolRegistry, tool_name: str, tool_input: Any = None
) -> bool:
    """Whether ``agent``'s write ``tool_name`` declares a probe this daemon can run.

    ``tool_input``: the write's recorded input; a process agent's MCP call is recorded as its
    server's lane (``mcp:<server>/tools/call``) with the tool's name in its input.
    """
    if agent.kind is AgentKind.PROCESS:
        return lane_probe(agent.mcp_servers, tool_name, tool_input) is not None
    if agent.kind is not AgentKind.BUILTIN:
        return False
    if tool_name in agent.tools:
        tool = registry.get(tool_name)
        if tool is None:
            return tool_name in WRITE_TOOLS  # a file write: always probed (``file_change``)
        return registry.probe_of(tool) is not None
    return any(
        spec.probe_of(tool_name) is not None and spec.exposes(tool_name)
        for spec in agent.mcp_servers
    )


async def drive(
    kit: DriveKit,
    run_id: str,
    agent: AgentDefinition,
    *,
    on_record: Callable[[list[Envelope]], None] | None = None,
) -> RunView:
    """Drive a run to its next resting point and return its view there.

    ``kit``: what every drive is handed (the store, the registry, the clock, the credentials
    ``gateway_for`` reads, the flow host behind the flow tools a built-in agent opted into; the
    run's flow session comes from its labels: ``flow_session``).

    Raises:
        DriveInterrupted: the drive stopped with the run recoverable (a model
            call that may succeed later); the message says how to continue.
        ReplayDivergence: the log does not match what this definition does;
            nothing was recorded.

    Concurrency:
        The drive holds the run (``kit.access.driving``) from before it reads the log until it
        returns: a drive of a run another drive holds waits for that one to end, then goes on
        from the log it left.
    """
    async with kit.access.driving.hold(run_id):
        return await _drive_held(kit, run_id, agent, on_record)


async def _drive_held(
    kit: DriveKit,
    run_id: str,
    agent: AgentDefinition,
    on_record: Callable[[list[Envelope]], None] | None,
) -> RunView:
    access, clock, flows = kit.access, kit.clock, kit.flows
    refusal = reach_refusal(agent, kit.credentials)
    if refusal is not None:
        log = await access.read(access.store.read_log, run_id)
        ctx = RunContext(access, run_id, log, on_record=on_record, clock=clock)
        return await fail_unreachable(ctx, refusal)
    if agent.kind is AgentKind.PROCESS:
        # A local agent process: its model calls cross the loopback proxy
        # (one is started for this drive when the caller has none).
        return await drive_process(
            access,
            run_id,
            agent,
            proxy=kit.proxy,
            on_record=on_record,
            clock=clock,
            restarts=kit.process_restarts,
            flows=flows,
            workspace=kit.registry.workspace,
        )
    if agent.kind is AgentKind.SERVICE:
        # A running service triggered over HTTP; its model calls reach this
        # run's session on the agent's own loopback port (held in ``ports``).
        return await drive_service(
            access,
            run_id,
            agent,
            proxy=kit.proxy,
            ports=kit.ports,
            on_record=on_record,
            clock=clock,
        )
    log = await access.read(access.store.read_log, run_id)
    ctx = RunContext(access, run_id, log, on_record=on_record, clock=clock)
    if ctx.view.idle and not probes_open_write(agent, kit.registry, ctx.view):
        return ctx.view
    gateway = gateway_for(agent, kit.credentials, kit.model_clients)
    try:
        # MCP servers are started only when the run first needs one live.
        mark = {MARK_VAR: store_fingerprint(access.store.url), RUN_VAR: run_id}
        async with open_connections(agent.mcp_servers, mark=mark) as mcp:
            session = flow_session(agent, run_id, ctx.view.labels, flows)
            await AgentLoop(agent, kit.registry, gateway, mcp, session, mark).run(ctx)
    except Parked:
        pass
    finally:
        await gateway.aclose()
    return ctx.view
