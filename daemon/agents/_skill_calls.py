"""A run's skills, resolved once and recorded: what its agent is told of them, and what its file
tools may read.

When a conversation starts, the agent's declared skills are resolved against the daemon's skill
directories by a recorded read (``resolve_skills``, like an MCP server's listing). Its answer,
each skill's name, description and location, is what the system prompt advertises and which
folders ``read`` reaches, so a replay after a crash (or a re-run) offers every recorded model
call the same prompt, however the operator's folders changed since; a run started after the
change sees the change. A skill that no longer resolves when a run first needs it fails the run,
saying which.

A process agent's skills are resolved live at each drive (``live_skills``): its ``salvor``
server's ``initialize`` answer advertises them, and the lane records that answer, so a restarted
process is told what it was told; the folders its ``read`` reaches are the ones they resolve to
at that drive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import trio
from salvor.protocol import TOOL_ERROR_KEY, Effect, RunFailed, RunState

from ..files import FileTools, file_tools
from ..recording import RunContext
from ..skills import Skill, SkillLibrary, SkillMissing, with_skills
from ..tools import Tool, ToolCall, ToolFailed, ToolRegistry
from ._agent_definition import AgentDefinition

RESOLVE_SKILLS = "resolve_skills"
_SCHEMA = {
    "type": "object",
    "properties": {"skills": {"type": "array", "items": {"type": "string"}}},
    "required": ["skills"],
}


class SkilledLoop(Protocol):
    """What ``take_skills`` uses of a built-in agent's conversation: an ``AgentLoop`` (which
    calls it, so it names only what it uses, and the two modules import one way)."""

    agent: AgentDefinition
    registry: ToolRegistry
    mark: Mapping[str, str] | None
    system_prompt: str
    files: FileTools
    # The tools offered by name, and the read that probes each write among them.
    tools: dict[str, Tool]
    probes: dict[str, Tool]


def skills_reader(library: SkillLibrary) -> Tool:
    """The read that resolves skill names in ``library``: ``{"skills": [{name, description,
    location}]}`` in the order asked; a name that resolves nowhere is its error."""

    async def handler(tool_input: Any, call: ToolCall) -> Any:
        names = tool_input.get("skills") if isinstance(tool_input, dict) else None
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ToolFailed("`skills` must be a list of skill names", retryable=False)
        try:
            found = await trio.to_thread.run_sync(library.resolve, names)
        except SkillMissing as exc:
            raise ToolFailed(str(exc), retryable=False) from None
        return {"skills": [skill.advertised() for skill in found]}

    return Tool(
        name=RESOLVE_SKILLS,
        description="Where each of an agent's skills is, and what it is for.",
        effect=Effect.READ,
        input_schema=_SCHEMA,
        handler=handler,
    )


def _recorded(answer: Any) -> list[Skill] | None:
    """The skills a recorded answer holds; None when it holds none (an error, a stranger)."""
    if not isinstance(answer, dict) or TOOL_ERROR_KEY in answer:
        return None
    entries = answer.get("skills")
    if not isinstance(entries, list):
        return None
    try:
        return [Skill.of(entry) for entry in entries]
    except (KeyError, TypeError):
        return None


async def resolved_skills(
    ctx: RunContext, library: SkillLibrary, names: tuple[str, ...]
) -> list[Skill]:
    """The skills ``names`` resolve to, through the run's log.

    Raises:
        Parked: they do not resolve (RunFailed is recorded, naming why).
    """
    answer = await ctx.tool_call(skills_reader(library), {"skills": list(names)})
    skills = _recorded(answer)
    if skills is None:
        error = answer.get(TOOL_ERROR_KEY, {}) if isinstance(answer, dict) else {}
        reason = error.get("message") if isinstance(error, dict) else None
        await ctx.control(
            RunFailed(error=f"the agent's skills do not resolve: {reason or answer!r}")
        )
        await ctx.park(RunState.FAILED)
    return skills


async def take_skills(loop: SkilledLoop, ctx: RunContext) -> None:
    """Resolve ``loop``'s skills through the log: its system prompt advertises them, and its
    file tools are rebuilt to read their folders (``read`` is among its tools: the definition
    granted it)."""
    agent, registry = loop.agent, loop.registry
    skills = await resolved_skills(ctx, registry.skills, agent.skills)
    loop.system_prompt = with_skills(agent.system_prompt, skills)
    folders = [skill.folder for skill in skills]
    loop.files = file_tools(registry.workspace, agent.access, agent.tools, loop.mark, folders)
    for name, tool in loop.files.tools.items():
        if registry.get(name) is None and name in loop.tools:
            loop.tools[name] = tool
            if tool.probe is not None:
                loop.probes[name] = loop.files.prober


async def live_skills(library: SkillLibrary, names: tuple[str, ...]) -> list[Skill] | str:
    """The skills ``names`` resolve to now (on a worker thread), or why they do not."""
    if not names:
        return []
    try:
        return await trio.to_thread.run_sync(library.resolve, list(names))
    except SkillMissing as exc:
        return f"the agent's skills do not resolve: {exc}"
