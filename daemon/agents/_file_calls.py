"""A built-in agent's ``write`` or ``edit``: planned by a recorded read, then written under a key.

The plan (``files.plan_input`` asked of the agent's planner) is a read like any other: answered
from the log once recorded, performed again while its intent is open. Its answer becomes the
write's ``expect``, so the write's recorded input says which bytes the file held and which it is
to hold, and its probe (``files.WRITE_PROBE``) can tell after a crash whether it landed. A plan
that refuses (a path outside the agent's write globs, an ``old_text`` not found) is the call's
answer: no write is recorded.
"""

from __future__ import annotations

from typing import Any

from salvor.protocol import TOOL_ERROR_KEY

from ..files import FileTools, content_key, plan_input
from ..recording import RunContext
from ..tools import Tool


async def file_change(ctx: RunContext, files: FileTools, tool: Tool, args: Any) -> Any:
    """The value the model is told of the write or edit ``tool`` called with ``args``.

    Raises:
        Parked: as ``RunContext.tool_call`` (a write found open that its probe cannot settle).
    """
    plan = await ctx.tool_call(files.planner, plan_input(tool.name, args))
    if not isinstance(plan, dict) or TOOL_ERROR_KEY in plan:
        return plan
    change = {**(args if isinstance(args, dict) else {}), "expect": plan}
    return await ctx.tool_call(tool, change, probe=files.prober, write_key=content_key(plan))
