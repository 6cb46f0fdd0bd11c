"""A built-in agent's definition: the one salvor's own loop drives (no ``kind``).

Its system prompt, model and ``[llm]``, its budgets and pricing, the registry tools and flow
tools it may call, its MCP servers and what it declares for the catalog. A prompt read from
``system_prompt_path`` is inlined before hashing, so the hash covers the text, not the path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from salvor.protocol import BUDGET_KINDS, FlowTool, MalformedEvent, check_schema

from ..files import FileAccess
from ..mcp import McpDefinitionError, McpServerSpec, parse_mcp_servers
from ..skills import SkillLibrary
from ..tools import FILE_TOOLS, SHELL_TOOL
from ._agent_definition import AgentDefinition
from ._credentials import Credentials
from ._definition_error import DefinitionError, did_you_mean, suggest
from ._definition_reach import check_mcp_opt_ins
from ._definition_rules import (
    MAX_WALL_TIME_BUDGET,
    check_keys,
    declarations,
    definition_hash,
    display_name,
    duration,
    expect,
    positive_number,
    record_prompts,
    unknown_keys,
    whole,
)
from ._llm_table import llm_settings
from ._markdown import MarkdownAgent
from ._skills_field import (
    granted,
    refuse_skill_read,
    skill_checks,
    skills_of,
)

FLOW_TOOL_NAMES = tuple(tool.value for tool in FlowTool)
BUILTIN_FIELDS = {
    "name",
    "model",
    "system_prompt",
    "system_prompt_path",
    "max_response_tokens",
    "record_prompts",
    "llm",
    "budgets",
    "pricing",
    "output_schema",
    "tools",
    "mcp_servers",
    "kind",
    "description",
    "flow_tools",
    "inputs",
    "outputs",
    "access",
    "skills",
}
PRICING_FIELDS = {"input_per_mtok", "output_per_mtok"}
TOOL_FIELDS = {"name"}


def builtin_agent(
    raw: dict,
    fmt: str,
    text: str,
    markdown: MarkdownAgent | None,
    *,
    base_dir: Path | None,
    known_tools,
    allow_paths: bool,
    allow_processes: bool,
    credentials: Credentials | None,
    read_prompt: Callable[[str], str] | None,
    stored: bool = False,
    library: SkillLibrary | None = None,
) -> AgentDefinition:
    """A definition without ``kind``, as ``parse_definition`` documents its arguments; the
    operator's declarations (``check_reach``) are the caller's to apply."""
    check_keys("the definition", raw, BUILTIN_FIELDS)
    mcp_servers = _mcp_servers(raw, credentials, allow_processes)
    name = display_name(raw)
    model = _model(raw, markdown)
    normalised: dict[str, Any] = {k: v for k, v in raw.items() if k != "name"}
    # One field after another, in a fixed order: a definition wrong in two places is refused
    # for the same one every time.
    prompt = _prompt(raw, normalised, allow_paths, base_dir, read_prompt)
    max_tokens = _max_response_tokens(raw)
    recorded = record_prompts(raw)
    llm = llm_settings(raw.get("llm", {}))
    budgets, pricing = _budgets_and_pricing(raw)
    output_schema = _output_schema(raw)
    tools = file_tools_of(raw.get("tools", []), known_tools, stored)
    access = file_access(raw)
    skills = skills_of(raw, library, stored)
    tools = granted(tools, skills)
    flow_tools = _flow_tools(raw)
    description, inputs, outputs = declarations(raw)
    stored_format, stored_text = _stored_copy(raw, normalised, name, fmt, text)
    return AgentDefinition(
        agent_def_hash=definition_hash(normalised),
        name=name,
        model=model,
        system_prompt=prompt,
        max_response_tokens=max_tokens,
        record_prompts=recorded,
        llm=llm,
        budgets=dict(budgets),
        pricing=dict(pricing) if pricing is not None else None,
        output_schema=output_schema,
        tools=tuple(tools),
        access=access,
        skills=skills,
        stored_format=stored_format,
        stored_text=stored_text,
        mcp_servers=mcp_servers,
        description=description,
        flow_tools=flow_tools,
        inputs=inputs,
        outputs=outputs,
        card=markdown.card if markdown is not None else None,
        architect=markdown.architect if markdown is not None else None,
    )


def _model(raw: dict, markdown: MarkdownAgent | None) -> str:
    model = raw.get("model")
    expect(
        isinstance(model, str) and model.strip() != "",
        "`model` is required and must be a non-empty string"
        + (": a built-in agent names the model its loop calls" if markdown is not None else ""),
        ("model",),
    )
    return model


def _max_response_tokens(raw: dict) -> int:
    max_tokens = raw.get("max_response_tokens", 1024)
    expect(
        whole(max_tokens) and max_tokens > 0,
        "`max_response_tokens` must be a positive integer",
        ("max_response_tokens",),
    )
    return int(max_tokens)


def _output_schema(raw: dict) -> dict | None:
    output_schema = raw.get("output_schema")
    if output_schema is not None:
        try:
            check_schema(output_schema)
        except MalformedEvent as exc:
            raise DefinitionError(f"[output_schema] {exc.message}", at=("output_schema",)) from None
    return output_schema


def _mcp_servers(
    raw: dict, credentials: Credentials | None, allow_processes: bool
) -> tuple[McpServerSpec, ...]:
    """A built-in agent's ``[[mcp_servers]]``, each held to the operator's declarations or to the
    process opt-in (``check_mcp_opt_ins``)."""
    try:
        mcp_servers = parse_mcp_servers(raw["mcp_servers"]) if "mcp_servers" in raw else ()
    except McpDefinitionError as exc:
        raise DefinitionError(str(exc), at=("mcp_servers",)) from None
    check_mcp_opt_ins(mcp_servers, credentials, allow_processes)
    return mcp_servers


def _prompt(
    raw: dict,
    normalised: dict,
    allow_paths: bool,
    base_dir: Path | None,
    read_prompt: Callable[[str], str] | None = None,
) -> str | None:
    """The system prompt, inline or read from ``system_prompt_path`` (then inlined into
    ``normalised``, so the hash covers the text, not the path)."""
    if "system_prompt_path" in raw:
        at = ("system_prompt_path",)
        expect(
            allow_paths,
            "`system_prompt_path` is only read from agent files on the daemon's own disk; "
            "send the prompt inline as `system_prompt`",
            at,
        )
        expect(
            "system_prompt" not in raw, "give `system_prompt` or `system_prompt_path`, not both", at
        )
        expect(
            isinstance(raw["system_prompt_path"], str),
            "`system_prompt_path` must be a string",
            at,
        )
        if read_prompt is not None:
            prompt = read_prompt(raw["system_prompt_path"])
        else:
            prompt = _read_prompt_file(raw["system_prompt_path"], base_dir, at)
        del normalised["system_prompt_path"]
        normalised["system_prompt"] = prompt
    prompt = normalised.get("system_prompt")
    expect(
        prompt is None or isinstance(prompt, str),
        "`system_prompt` must be a string",
        ("system_prompt",),
    )
    return prompt


def _read_prompt_file(target: str, base_dir: Path | None, at: tuple) -> str:
    path = Path(target)
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DefinitionError(
            f"cannot read system_prompt_path {str(path)!r}: {exc.strerror}", at=at
        ) from None


def _budgets_and_pricing(raw: dict) -> tuple[dict, dict | None]:
    """``[budgets]`` (each a positive number) and ``[pricing]`` (which a cost budget needs)."""
    budgets = raw.get("budgets", {})
    check_keys("[budgets]", budgets, set(BUDGET_KINDS), ("budgets",))
    for kind, limit in budgets.items():
        if kind == "wall_time_seconds":
            duration(f"[budgets] {kind}", limit, ("budgets", kind), MAX_WALL_TIME_BUDGET)
        else:
            positive_number(f"[budgets] {kind}", limit, ("budgets", kind))
    pricing = raw.get("pricing")
    if pricing is not None:
        check_keys("[pricing]", pricing, PRICING_FIELDS, ("pricing",))
        for key in sorted(PRICING_FIELDS):
            expect(key in pricing, f"[pricing] needs {key}", ("pricing",))
            expect(
                type(pricing[key]) in (int, float) and pricing[key] >= 0,
                f"[pricing] {key} must be a non-negative number",
                ("pricing", key),
            )
    expect(
        "cost_usd" not in budgets or pricing is not None,
        "a cost_usd budget needs a [pricing] table",
        ("budgets", "cost_usd"),
    )
    return budgets, pricing


def _stored_copy(
    raw: dict, normalised: dict, name: str | None, fmt: str, text: str
) -> tuple[str, str]:
    """What the store keeps: the text as sent, or, when the prompt came from a file, the
    normalised definition with the prompt inlined (the file may not exist where a run resumes)."""
    uses_path = "system_prompt_path" in raw
    if uses_path:
        # The prompt file may not exist where the run is resumed: keep the
        # normalised definition, prompt inlined, as the stored copy.
        stored_copy = dict(normalised)
        if name is not None:
            stored_copy["name"] = name
        return "json", json.dumps(stored_copy, indent=2, ensure_ascii=False)
    return fmt, text


def _file_tool_offered(tool_name: str, known_tools, stored: bool, at: tuple) -> None:
    """A file tool is granted only where the operator offers it (a workspace; the shell turned
    on); a stored definition keeps it (its runs' calls then answer that it is unavailable)."""
    if stored or tool_name in known_tools:
        return
    if tool_name == SHELL_TOOL:
        expect(
            False,
            f"{SHELL_TOOL!r} runs shell commands, which this daemon offers only when its operator "
            "turns them on (salvor serve --workspace DIR --allow-bash)",
            at,
        )
    expect(
        False,
        f"{tool_name!r} is a file tool, and this daemon has no workspace for it: its operator "
        "gives one with salvor serve --workspace DIR",
        at,
    )


def file_access(raw: dict) -> FileAccess | None:
    """``access``: the globs the file tools read and write under (absent: the default)."""
    if "access" not in raw:
        return None
    try:
        return FileAccess.parse(raw["access"])
    except ValueError as exc:
        raise DefinitionError(str(exc), at=("access",)) from None


def file_tools_of(tools_raw: Any, known_tools, stored: bool = False) -> list[str]:
    """The ``[[tools]]`` entries: each a tool of the daemon's registry or a file tool it offers,
    listed once, and none named as a flow tool is (the model would see two tools of one
    name)."""
    expect(isinstance(tools_raw, list), "`tools` must be an array of tables", ("tools",))
    tools: list[str] = []
    for index, entry in enumerate(tools_raw):
        tools.append(_registry_tool(entry, index, known_tools, tools, stored))
    return tools


def _registry_tool(
    entry: Any, index: int, known_tools, earlier: list[str], stored: bool = False
) -> str:
    """One ``[[tools]]`` entry's tool name (a registry tool, or a file tool the daemon offers),
    ``earlier`` the names listed before it."""
    at = ("tools", index)
    check_keys("[[tools]]", entry, TOOL_FIELDS, at)
    tool_name = entry.get("name")
    expect(
        isinstance(tool_name, str) and bool(tool_name),
        "every [[tools]] entry needs a `name`",
        at,
    )
    expect(
        tool_name not in FLOW_TOOL_NAMES,
        f"{tool_name!r} is a flow tool: list it in `flow_tools`, not [[tools]] (a registry "
        "tool of a flow tool's name would be ambiguous)",
        (*at, "name"),
    )
    refuse_skill_read(tool_name, (*at, "name"))
    if tool_name in FILE_TOOLS:
        _file_tool_offered(tool_name, known_tools, stored, (*at, "name"))
        expect(tool_name not in earlier, f"tool {tool_name!r} is listed twice", (*at, "name"))
        return tool_name
    # A misspelt flow tool in a markdown file's `tools` lands here too.
    near = suggest(tool_name, [*known_tools, *FLOW_TOOL_NAMES])
    expect(
        tool_name in known_tools,
        f"unknown tool {tool_name!r}{did_you_mean(near)}; this daemon's registry holds: "
        f"{', '.join(sorted(known_tools)) or 'nothing'}",
        (*at, "name"),
        near,
    )
    expect(tool_name not in earlier, f"tool {tool_name!r} is listed twice", (*at, "name"))
    return tool_name


def _flow_tools(raw: dict) -> tuple[FlowTool, ...]:
    """``flow_tools``: the flow tools the agent opts into, each named once."""
    if "flow_tools" not in raw:
        return ()
    names = raw["flow_tools"]
    _flow_tools_list(names)
    chosen: list[FlowTool] = []
    for index, name in enumerate(names):
        chosen.append(_flow_tool(name, index, chosen))
    return tuple(chosen)


def _flow_tools_list(names: Any) -> None:
    expect(
        isinstance(names, list),
        f"`flow_tools` must be an array of flow tool names ({', '.join(FLOW_TOOL_NAMES)})",
        ("flow_tools",),
    )


def _flow_tool(name: Any, index: int, earlier: list[FlowTool]) -> FlowTool:
    """One ``flow_tools`` entry, ``earlier`` the flow tools named before it."""
    at = ("flow_tools", index)
    expect(isinstance(name, str), "`flow_tools` must be an array of strings", at)
    near = suggest(name, FLOW_TOOL_NAMES)
    expect(
        name in FLOW_TOOL_NAMES,
        f"unknown flow tool {name!r}{did_you_mean(near)}; the flow tools are "
        f"{', '.join(FLOW_TOOL_NAMES)}",
        at,
        near,
    )
    expect(FlowTool(name) not in earlier, f"flow tool {name!r} is listed twice", at)
    return FlowTool(name)


# -- every refusal, field by field ---------------------------------------------------------------


def builtin_refusals(
    raw: dict,
    markdown: MarkdownAgent | None,
    *,
    known_tools,
    allow_processes: bool,
    credentials: Credentials | None,
    library: SkillLibrary | None = None,
) -> list[DefinitionError]:
    """What ``builtin_agent`` would refuse a definition from outside (no file paths) for, every
    field checked on its own instead of stopping at the first: each unknown key, each
    ``[[tools]]`` and ``flow_tools`` entry, each other field. Each check is one ``builtin_agent``
    makes on the same value, so a definition with any refusal here is one it refuses; a refusal
    of the whole (the hash, the operator's declarations) is its alone."""
    found = unknown_keys("the definition", raw, BUILTIN_FIELDS)
    checks: list[Callable[[], object]] = [
        lambda: _mcp_servers(raw, credentials, allow_processes),
        lambda: display_name(raw),
        lambda: _model(raw, markdown),
        lambda: _prompt(raw, dict(raw), False, None),
        lambda: _max_response_tokens(raw),
        lambda: record_prompts(raw),
        lambda: llm_settings(raw.get("llm", {})),
        lambda: _budgets_and_pricing(raw),
        lambda: _output_schema(raw),
        lambda: declarations({k: raw[k] for k in ("description",) if k in raw}),
        lambda: declarations({k: raw[k] for k in ("inputs",) if k in raw}),
        lambda: declarations({k: raw[k] for k in ("outputs",) if k in raw}),
    ]
    checks += skill_checks(raw, library)
    tools = raw.get("tools", [])
    if isinstance(tools, list):
        names = [entry.get("name") if isinstance(entry, dict) else None for entry in tools]
        checks += [
            partial(_registry_tool, entry, index, known_tools, names[:index])
            for index, entry in enumerate(tools)
        ]
    else:
        checks.append(lambda: file_tools_of(tools, known_tools))
    flow = raw.get("flow_tools", [])
    if isinstance(flow, list):
        valid = [FlowTool(n) if isinstance(n, str) and n in FLOW_TOOL_NAMES else None for n in flow]
        checks += [
            partial(_flow_tool, name, index, [tool for tool in valid[:index] if tool is not None])
            for index, name in enumerate(flow)
        ]
    else:
        checks.append(lambda: _flow_tools_list(flow))
    for check in checks:
        try:
            check()
        except DefinitionError as exc:
            found.append(exc)
    return found
