"""Built-in agent definitions: TOML, JSON or markdown files that are pure data.

A definition is validated strictly (an unknown field is a loud error, not a
silently dropped budget) and identified by ``agent_def_hash``: sha256 over the
canonical JSON of the normalised definition, with the display ``name`` left
out so renaming an agent never mints a new identity. A field the text does not
give is absent from the normalised definition, so a field this module gains
never changes the hash of a definition written before it.
"""

from __future__ import annotations

import enum
import json
import shlex
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from salvor.protocol import (
    BUDGET_KINDS,
    MAX_NESTING,
    BadDeclaration,
    DeclaredInput,
    DeclaredOutput,
    FlowTool,
    MalformedEvent,
    MalformedJson,
    check_document,
    check_nesting,
    check_schema,
    parse_inputs,
    parse_outputs,
    parse_strict,
    sha256_hash,
)

from ..mcp import McpDefinitionError, McpServerSpec, parse_mcp_servers
from ..proxies import variable_suffix
from ..web import HEADER_NAME, is_http_url, stray_placeholder
from ._credentials import Credentials, Undeclared
from ._definition_error import DefinitionError, did_you_mean, suggest
from ._markdown import MarkdownAgent, read_markdown

MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
# The text of one definition, in any format. A system prompt of a million bytes is far past any
# model's context; the bound keeps a parse well under a second.
MAX_DEFINITION_BYTES = 1024 * 1024
PROVIDERS = ("anthropic", "openai", "demo")
DEFAULT_PROVIDER = "anthropic"  # an [llm] table without `provider`
# A `command` element that a run replaces with its prompt, as one argument.
PROMPT_PLACEHOLDER = "{prompt}"
# Where a process agent's result comes from when it calls no finish.
OUTPUT_SOURCES = ("model", "stdout")
# The formats a definition's text comes in (and the store keeps).
FORMATS = ("toml", "json", "md")
FLOW_TOOL_NAMES = tuple(tool.value for tool in FlowTool)

_TOP = {
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
}
_LLM = {
    "provider",
    "base_url",
    "base_url_env",
    "api_key_env",
    "max_retries",
    "timeout_seconds",
    "stream",
}
_PRICING = {"input_per_mtok", "output_per_mtok"}
_TOOL = {"name"}
_PROCESS_TOP = {
    "name",
    "kind",
    "command",
    "cwd",
    "env",
    "timeout",
    "record_prompts",
    "mcp_servers",
    "description",
    "inputs",
    "outputs",
    "salvor_mcp",
    "output_from",
}
_SERVICE_TOP = {"name", "kind", "url", "proxy_port", "headers", "timeout", "record_prompts"}


class AgentKind(enum.StrEnum):
    """What drives an agent's run: salvor's own loop, a local process, or a running service."""

    BUILTIN = "builtin"
    PROCESS = "process"
    SERVICE = "service"


# The kinds a definition names with ``kind``; absent, it is a built-in agent.
KINDS = (AgentKind.PROCESS, AgentKind.SERVICE)
DEFAULT_PROCESS_TIMEOUT = 300.0
# The longest each duration a definition sets may be, in seconds, with how a refusal says it. A
# bound refuses nonsense (1e300 passes every positivity check and overflows the first timer or
# date it reaches), not a policy: each lies far past what its field needs.
# One life of a process or service agent's process (one drive): a run that waits on a person or
# a timer has its process stopped, so this times work alone, and a week is past any agent's
# single stretch of it.
MAX_PROCESS_TIMEOUT = (7 * 86400.0, "7 days")
# One model call, a streamed answer included.
MAX_LLM_TIMEOUT = (3600.0, "1 hour")
# A run's whole life, its sleeps and its waits on people included (leave the budget out for none).
MAX_WALL_TIME_BUDGET = (365 * 86400.0, "365 days")
# Why each kind needs the operator's opt-in before it is accepted over HTTP.
_OPT_IN_REASONS = {
    "process": "process agents run a command on the daemon's machine",
    "service": "service agents make the daemon bind a loopback port and POST to a URL",
    "mcp_command": "an MCP server with `command` makes the daemon run a command on its machine",
    "mcp_secret": (
        "an MCP server whose headers name `${VAR}` (or `bearer_token_env`) sends the "
        "daemon's own environment to a URL"
    ),
}
# The fields each table of a definition takes over HTTP, by table: what the OpenAPI document
# describes (``api._openapi`` refuses to build when its schemas name other fields). A file on the
# daemon's disk may also give `system_prompt_path` and `[llm] base_url_env`; HTTP refuses both.
HTTP_FIELDS: dict[str, frozenset[str]] = {
    "builtin": frozenset(_TOP - {"kind", "system_prompt_path"}),
    "llm": frozenset(_LLM - {"base_url_env"}),
    "budgets": frozenset(BUDGET_KINDS),
    "pricing": frozenset(_PRICING),
    "tools": frozenset(_TOOL),
    "process": frozenset(_PROCESS_TOP),
    "service": frozenset(_SERVICE_TOP),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmSettings:
    provider: str = "anthropic"
    base_url: str | None = None
    base_url_env: str | None = None
    api_key_env: str | None = None
    max_retries: int = 4
    timeout_seconds: float = 120.0
    stream: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessSettings:
    """How to start a local agent process (``kind = "process"``)."""

    command: tuple[str, ...]
    cwd: str | None = None
    env: dict = field(default_factory=dict)
    timeout: float = DEFAULT_PROCESS_TIMEOUT


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceSettings:
    """How to drive a service that is already running (``kind = "service"``).

    ``headers`` keeps its ``${VAR}`` placeholders: they are resolved from the
    daemon's environment each time the trigger is sent, never stored.
    """

    url: str
    proxy_port: int
    headers: dict = field(default_factory=dict)
    timeout: float = DEFAULT_PROCESS_TIMEOUT


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentDefinition:
    """A validated built-in agent."""

    agent_def_hash: str
    name: str | None
    model: str
    system_prompt: str | None
    max_response_tokens: int
    record_prompts: bool
    llm: LlmSettings
    budgets: dict = field(default_factory=dict)
    pricing: dict | None = None
    output_schema: dict | None = None
    tools: tuple[str, ...] = ()
    # What the store keeps so the definition can be rebuilt after a restart.
    stored_format: str = "json"
    stored_text: str = ""
    # BUILTIN for salvor's own loop; PROCESS for a local agent process
    # driven through the loopback model proxy (``process`` then says how).
    kind: AgentKind = AgentKind.BUILTIN
    process: ProcessSettings | None = None
    # SERVICE: a program already running that salvor triggers over HTTP.
    service: ServiceSettings | None = None
    # The MCP servers whose tools a built-in agent calls, in declared order.
    mcp_servers: tuple[McpServerSpec, ...] = ()
    # What the catalog says of the agent (a subagent's caller picks by it).
    description: str | None = None
    # The flow tools a built-in agent opted into, as listed; its session decides which it sees.
    flow_tools: tuple[FlowTool, ...] = ()
    # The named inputs a subagent call passes, and the typed outputs its finish carries.
    inputs: tuple[DeclaredInput, ...] = ()
    outputs: tuple[DeclaredOutput, ...] = ()
    # A process agent: whether the `salvor` MCP server is offered, and where its result comes
    # from when it calls no finish ("model": its last answer; "stdout": what it printed).
    salvor_mcp: bool = True
    output_from: str = "model"
    # A markdown file's display metadata (pi-flows' `card` and `architect`): shown by the catalog,
    # kept out of the hash like the name.
    card: dict | None = None
    architect: dict | None = None

    @property
    def offerable_flow_tools(self) -> tuple[FlowTool, ...]:
        """Every flow tool some session of this agent may be offered: its opt-in, and ``finish``
        when it declares outputs (a child session returns them through it)."""
        extra = (
            (FlowTool.FINISH,) if self.outputs and FlowTool.FINISH not in self.flow_tools else ()
        )
        return (*self.flow_tools, *extra)


def _expect(
    cond: bool, message: str, at: tuple[str | int, ...] = (), suggestion: str | None = None
) -> None:
    if not cond:
        raise DefinitionError(message, at=at, suggestion=suggestion)


def _check_keys(where: str, table: Any, allowed: set[str], at: tuple[str | int, ...] = ()) -> None:
    _expect(isinstance(table, dict), f"`{where}` must be a table", at)
    unknown = sorted(set(table) - allowed)
    if unknown:
        near = suggest(unknown[0], allowed)
        raise DefinitionError(
            f"unknown field `{unknown[0]}` in {where}{did_you_mean(near)}; "
            f"allowed: {', '.join(sorted(allowed))}",
            at=(*at, unknown[0]),
            suggestion=near,
        )


def _whole(value: Any) -> bool:
    """An integer as JSON means one: 3 and 3.0 are the same number (and hash alike in RFC 8785)."""
    return type(value) is int or (type(value) is float and value.is_integer())


def _positive_number(where: str, value: Any, at: tuple[str | int, ...]) -> None:
    _expect(type(value) in (int, float) and value > 0, f"`{where}` must be a positive number", at)


def _duration(where: str, value: Any, at: tuple[str | int, ...], bound: tuple[float, str]) -> None:
    """A positive number of seconds no longer than ``bound`` (seconds, and how to say them)."""
    most, said = bound
    _expect(
        type(value) in (int, float) and 0 < value <= most,
        f"`{where}` must be a positive number of seconds, at most {most:.0f} ({said})",
        at,
    )


def _document(text: str, fmt: str, stored: bool) -> tuple[dict, MarkdownAgent | None]:
    """The definition's table as its text holds it (a markdown file's: its front matter read as
    the TOML fields it stands for), held to strict JSON's rules."""
    _expect(fmt in FORMATS, f"an agent definition is TOML, JSON or markdown, not {fmt!r}")
    # A stored copy was held to the bound of its day; a new one to this one, before it is parsed.
    if not stored and len(text) * 4 > MAX_DEFINITION_BYTES:
        size = len(text.encode("utf-8", "surrogatepass"))
        _expect(
            size <= MAX_DEFINITION_BYTES,
            f"the definition is {size} bytes; a definition may be at most "
            f"{MAX_DEFINITION_BYTES} bytes (1 MiB)",
        )
    markdown = None
    try:
        if fmt == "md":
            markdown = read_markdown(text)
            raw: Any = markdown.fields
        elif fmt == "toml":
            raw = tomllib.loads(text)
        else:
            raw = parse_strict(text, "the definition", big_integers=stored)
        # TOML nests through dotted keys and tables too, and carries what JSON cannot (dates, inf,
        # 64-bit integers): the parsed value is held to strict JSON's rules, by a stack (a stored
        # copy only to the depth bound it was accepted under).
        (check_nesting if stored else check_document)(raw, "the definition")
    except MalformedJson as exc:
        raise DefinitionError(exc.message) from None
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        if isinstance(exc, DefinitionError):
            raise
        raise DefinitionError(f"the definition is not valid {fmt.upper()}: {exc}") from None
    except RecursionError:  # tomllib's parser recurses on nested arrays and inline tables
        raise DefinitionError(
            f"the definition nests too deeply; the limit is {MAX_NESTING} levels"
        ) from None
    _expect(isinstance(raw, dict), "`the definition` must be a table")
    return raw, markdown


def parse_definition(
    text: str,
    fmt: str,
    *,
    base_dir: Path | None = None,
    known_tools=(),
    allow_paths: bool = True,
    allow_processes: bool = True,
    credentials: Credentials | None = None,
    stored: bool = False,
    read_prompt: Callable[[str], str] | None = None,
) -> AgentDefinition:
    """Parse and validate a definition from its text.

    Args:
        text: the file's contents.
        fmt: ``"toml"``, ``"json"`` or ``"md"`` (a markdown agent file: YAML front matter, the
            body its system prompt; it stands for the TOML definition of the same fields, and
            hashes as that one does).
        base_dir: where ``system_prompt_path`` is resolved from.
        known_tools: names the daemon's tool registry holds.
        allow_paths: whether ``system_prompt_path`` may name a file. A
            definition that arrives over the network must not make the daemon
            read its own files, so the HTTP API passes False.
        allow_processes: whether a ``kind = "process"`` definition (a command
            the daemon will run) or a ``kind = "service"`` one (a port it
            binds, a URL it POSTs to) is accepted, and likewise an MCP server
            the daemon spawns (``command``) or one whose headers read the
            daemon's environment. Over HTTP only when the operator started
            the daemon with ``--allow-process-agents``.
        credentials: the operator's declarations a definition from HTTP is
            held to (``Credentials.check_reach``, one rule for every kind): its
            ``[llm]`` names a declared model endpoint (never a variable), a service
            agent's ``url`` a declared service origin, each MCP ``url`` server a
            declared MCP origin, and headers only the variables bound to those
            origins. None for an agent file the operator runs.
        read_prompt: gives the text of ``system_prompt_path`` as written, instead of reading
            it from ``base_dir`` (a flow's agent file, whose prompt came with it); raises
            DefinitionError when it has none.
        stored: the daemon's own stored copy (``Definitions.load_agent``), read
            by the rules it was accepted under: integers beyond 2**53 (and,
            in TOML, a ``\\u0000``) that a new definition is refused for, so
            the runs recorded against it still resume, under the same hash.

    Raises:
        DefinitionError: with one sentence naming what is wrong, and ``at`` the field it is
            about.
    """
    raw, markdown = _document(text, fmt, stored)
    if "kind" in raw:
        return _reached(_outside_kind(raw, fmt, text, allow_processes), credentials)
    _check_keys("the definition", raw, _TOP)
    mcp_servers = _builtin_mcp_servers(raw, credentials, allow_processes)
    name = _name(raw)
    model = raw.get("model")
    _expect(
        isinstance(model, str) and model.strip() != "",
        "`model` is required and must be a non-empty string"
        + (": a built-in agent names the model its loop calls" if markdown is not None else ""),
        ("model",),
    )
    normalised: dict[str, Any] = {k: v for k, v in raw.items() if k != "name"}
    prompt = _prompt(raw, normalised, allow_paths, base_dir, read_prompt)
    max_tokens = _max_response_tokens(raw)
    record_prompts = _record_prompts(raw)
    llm = _llm(raw.get("llm", {}))

    budgets, pricing = _budgets_and_pricing(raw)

    output_schema = _output_schema(raw)

    tools = _registry_tools(raw.get("tools", []), known_tools)
    flow_tools = _flow_tools(raw)
    description, inputs, outputs = _declarations(raw)

    stored_format, stored_text = _stored_copy(raw, normalised, name, fmt, text)
    agent = AgentDefinition(
        agent_def_hash=_hash(normalised),
        name=name,
        model=model,
        system_prompt=prompt,
        max_response_tokens=max_tokens,
        record_prompts=record_prompts,
        llm=llm,
        budgets=dict(budgets),
        pricing=dict(pricing) if pricing is not None else None,
        output_schema=output_schema,
        tools=tuple(tools),
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
    return _reached(agent, credentials)


def _reached(agent: AgentDefinition, credentials: Credentials | None) -> AgentDefinition:
    """``agent``, once the operator's declarations allow every URL, variable and key it names
    (``Credentials.check_reach``, the one rule for every kind); no check without them."""
    if credentials is not None:
        try:
            credentials.check_reach(agent)
        except Undeclared as exc:
            raise DefinitionError(str(exc), at=exc.at) from None
    return agent


def _hash(normalised: dict) -> str:
    try:
        return sha256_hash(normalised)
    except ValueError as exc:  # NaN, an infinity, a lone surrogate: nothing canonical JSON carries
        raise DefinitionError(f"the definition holds a value JSON cannot carry: {exc}") from None


def _record_prompts(raw: dict) -> bool:
    record_prompts = raw.get("record_prompts", False)
    _expect(
        isinstance(record_prompts, bool),
        "`record_prompts` must be true or false",
        ("record_prompts",),
    )
    return record_prompts


def _llm(llm_raw: Any) -> LlmSettings:
    """The ``[llm]`` table: which wire format, which endpoint (over HTTP a declared one:
    ``check_reach``)."""
    _check_keys("[llm]", llm_raw, _LLM, ("llm",))
    provider = llm_raw.get("provider", DEFAULT_PROVIDER)
    _expect(
        provider in PROVIDERS,
        f"[llm] provider must be one of {', '.join(PROVIDERS)}",
        ("llm", "provider"),
        suggest(provider, PROVIDERS) if isinstance(provider, str) else None,
    )
    for key in ("base_url", "base_url_env", "api_key_env"):
        _expect(
            key not in llm_raw or isinstance(llm_raw[key], str),
            f"[llm] {key} must be a string",
            ("llm", key),
        )
    retries = llm_raw.get("max_retries", 4)
    _expect(
        _whole(retries) and 0 <= retries <= 20,
        "[llm] max_retries must be an integer from 0 to 20",
        ("llm", "max_retries"),
    )
    timeout = llm_raw.get("timeout_seconds", 120)
    _duration("[llm] timeout_seconds", timeout, ("llm", "timeout_seconds"), MAX_LLM_TIMEOUT)
    stream = llm_raw.get("stream", False)
    _expect(isinstance(stream, bool), "[llm] stream must be true or false", ("llm", "stream"))
    return LlmSettings(
        provider=provider,
        base_url=llm_raw.get("base_url"),
        base_url_env=llm_raw.get("base_url_env"),
        api_key_env=llm_raw.get("api_key_env"),
        max_retries=int(retries),
        timeout_seconds=float(timeout),
        stream=stream,
    )


def _registry_tools(tools_raw: Any, known_tools) -> list[str]:
    """The ``[[tools]]`` entries: each a tool of the daemon's registry, listed once, and none
    named as a flow tool is (the model would see two tools of one name)."""
    _expect(isinstance(tools_raw, list), "`tools` must be an array of tables", ("tools",))
    tools: list[str] = []
    for index, entry in enumerate(tools_raw):
        at = ("tools", index)
        _check_keys("[[tools]]", entry, _TOOL, at)
        tool_name = entry.get("name")
        _expect(
            isinstance(tool_name, str) and bool(tool_name),
            "every [[tools]] entry needs a `name`",
            at,
        )
        _expect(
            tool_name not in FLOW_TOOL_NAMES,
            f"{tool_name!r} is a flow tool: list it in `flow_tools`, not [[tools]] (a registry "
            "tool of a flow tool's name would be ambiguous)",
            (*at, "name"),
        )
        # A misspelt flow tool in a markdown file's `tools` lands here too.
        near = suggest(tool_name, [*known_tools, *FLOW_TOOL_NAMES])
        _expect(
            tool_name in known_tools,
            f"unknown tool {tool_name!r}{did_you_mean(near)}; this daemon's registry holds: "
            f"{', '.join(sorted(known_tools)) or 'nothing'}",
            (*at, "name"),
            near,
        )
        _expect(tool_name not in tools, f"tool {tool_name!r} is listed twice", (*at, "name"))
        tools.append(tool_name)
    return tools


def _flow_tools(raw: dict) -> tuple[FlowTool, ...]:
    """``flow_tools``: the flow tools the agent opts into, each named once."""
    if "flow_tools" not in raw:
        return ()
    names = raw["flow_tools"]
    _expect(
        isinstance(names, list),
        f"`flow_tools` must be an array of flow tool names ({', '.join(FLOW_TOOL_NAMES)})",
        ("flow_tools",),
    )
    chosen: list[FlowTool] = []
    for index, name in enumerate(names):
        at = ("flow_tools", index)
        _expect(isinstance(name, str), "`flow_tools` must be an array of strings", at)
        near = suggest(name, FLOW_TOOL_NAMES)
        _expect(
            name in FLOW_TOOL_NAMES,
            f"unknown flow tool {name!r}{did_you_mean(near)}; the flow tools are "
            f"{', '.join(FLOW_TOOL_NAMES)}",
            at,
            near,
        )
        _expect(FlowTool(name) not in chosen, f"flow tool {name!r} is listed twice", at)
        chosen.append(FlowTool(name))
    return tuple(chosen)


def _declarations(
    raw: dict,
) -> tuple[str | None, tuple[DeclaredInput, ...], tuple[DeclaredOutput, ...]]:
    """What a built-in and a process agent both declare for the catalog: ``description``,
    ``inputs``, ``outputs``."""
    # Absent is none; a null is refused as any other non-string (the document says a string).
    description = raw.get("description")
    if "description" in raw:
        _expect(isinstance(description, str), "`description` must be a string", ("description",))
        _expect(
            len(description) <= MAX_DESCRIPTION_CHARS,
            f"`description` must be at most {MAX_DESCRIPTION_CHARS} characters",
            ("description",),
        )
    try:
        inputs = parse_inputs(raw["inputs"]) if "inputs" in raw else ()
    except BadDeclaration as exc:
        raise DefinitionError(str(exc), at=("inputs",)) from None
    try:
        outputs = parse_outputs(raw["outputs"]) if "outputs" in raw else ()
    except BadDeclaration as exc:
        raise DefinitionError(str(exc), at=("outputs",)) from None
    return description, inputs, outputs


def _outside_kind(raw: dict, fmt: str, text: str, allow_processes: bool) -> AgentDefinition:
    """A definition with ``kind``: a process or a service agent, if the operator opted in."""
    kind = raw["kind"]
    _expect(
        kind in KINDS,
        f"`kind` must be one of {', '.join(repr(k.value) for k in KINDS)} "
        "(or absent for a built-in agent)",
        ("kind",),
    )
    _expect(
        allow_processes,
        f"{_OPT_IN_REASONS[kind]}, so this daemon accepts them over "
        "HTTP only when started with --allow-process-agents",
        ("kind",),
    )
    if kind == AgentKind.SERVICE:
        return _parse_service(raw, fmt, text)
    return _parse_process(raw, fmt, text)


def _max_response_tokens(raw: dict) -> int:
    max_tokens = raw.get("max_response_tokens", 1024)
    _expect(
        _whole(max_tokens) and max_tokens > 0,
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


def _builtin_mcp_servers(
    raw: dict, credentials: Credentials | None, allow_processes: bool
) -> tuple[McpServerSpec, ...]:
    """A built-in agent's ``[[mcp_servers]]``, each held to the operator's declarations (an HTTP
    caller's: ``check_reach``) or to the process opt-in (a command, a header reading the
    environment)."""
    try:
        mcp_servers = parse_mcp_servers(raw["mcp_servers"]) if "mcp_servers" in raw else ()
    except McpDefinitionError as exc:
        raise DefinitionError(str(exc), at=("mcp_servers",)) from None
    for index, server in enumerate(mcp_servers):
        at = ("mcp_servers", index)
        if credentials is not None and server.url is not None:
            # The operator's declarations decide (``check_reach``), before registration
            # contacts the server.
            continue
        reason = (
            "mcp_command"
            if server.command is not None
            else "mcp_secret"
            if server.reads_environment()
            else None
        )
        _expect(
            reason is None or allow_processes,
            f"[[mcp_servers]] {server.name!r}: {_OPT_IN_REASONS[reason] if reason else ''}, so "
            "this daemon accepts it over HTTP only when started with --allow-process-agents",
            at,
        )
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
        _expect(
            allow_paths,
            "`system_prompt_path` is only read from agent files on the daemon's own disk; "
            "send the prompt inline as `system_prompt`",
            at,
        )
        _expect(
            "system_prompt" not in raw, "give `system_prompt` or `system_prompt_path`, not both", at
        )
        _expect(
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
    _expect(
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
    _check_keys("[budgets]", budgets, set(BUDGET_KINDS), ("budgets",))
    for kind, limit in budgets.items():
        if kind == "wall_time_seconds":
            _duration(f"[budgets] {kind}", limit, ("budgets", kind), MAX_WALL_TIME_BUDGET)
        else:
            _positive_number(f"[budgets] {kind}", limit, ("budgets", kind))
    pricing = raw.get("pricing")
    if pricing is not None:
        _check_keys("[pricing]", pricing, _PRICING, ("pricing",))
        for key in sorted(_PRICING):
            _expect(key in pricing, f"[pricing] needs {key}", ("pricing",))
            _expect(
                type(pricing[key]) in (int, float) and pricing[key] >= 0,
                f"[pricing] {key} must be a non-negative number",
                ("pricing", key),
            )
    _expect(
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


def _name(raw: dict) -> str | None:
    name = raw.get("name")
    if name is not None:
        _expect(isinstance(name, str), "`name` must be a string", ("name",))
        _expect(name.strip() != "", "`name` must not be empty or all whitespace", ("name",))
        _expect(
            len(name) <= MAX_NAME_CHARS,
            f"`name` must be at most {MAX_NAME_CHARS} characters",
            ("name",),
        )
    return name


def _parse_process(raw: dict, fmt: str, text: str) -> AgentDefinition:
    """A ``kind = "process"`` definition: a local command driven through the model proxy."""
    _check_keys("a process agent", raw, _PROCESS_TOP)
    name = _name(raw)
    command = raw.get("command")
    at = ("command",)
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise DefinitionError(
                f"`command` cannot be split into arguments: {exc}", at=at
            ) from None
    elif isinstance(command, list):
        _expect(
            all(isinstance(arg, str) for arg in command),
            "`command` must be an array of strings",
            at,
        )
        argv = list(command)
    else:
        raise DefinitionError(
            "a process agent needs `command`: an array of strings, or "
            "one string split as a shell would",
            at=at,
        )
    _expect(
        bool(argv) and argv[0] not in ("", PROMPT_PLACEHOLDER), "`command` must name a program", at
    )
    for index, arg in enumerate(argv):
        # Replaced only whole: inside a longer argument (`sh -c "llm {prompt}"`) the task's
        # text would be parsed by whatever reads that argument, a shell among them.
        _expect(
            arg == PROMPT_PLACEHOLDER or PROMPT_PLACEHOLDER not in arg,
            f"`command` argument {index} holds {PROMPT_PLACEHOLDER} inside other text; it is "
            "replaced only as a whole argument (the prompt becomes exactly one argument, never "
            "shell text): give it an element of its own",
            (*at, index),
        )
    cwd = raw.get("cwd")
    _expect(
        cwd is None or (isinstance(cwd, str) and cwd != ""),
        "`cwd` must be a non-empty string",
        ("cwd",),
    )
    env = raw.get("env", {})
    _expect(isinstance(env, dict), "`env` must be a table of strings", ("env",))
    for key, value in env.items():
        _expect(
            key != "" and "=" not in key and "\0" not in key,
            f"`env` key {key!r} is not a variable name",
            ("env", key),
        )
        _expect(isinstance(value, str), f"`env` value of {key} must be a string", ("env", key))
    salvor_mcp = raw.get("salvor_mcp", True)
    _expect(isinstance(salvor_mcp, bool), "`salvor_mcp` must be true or false", ("salvor_mcp",))
    output_from = raw.get("output_from", "model")
    _expect(
        output_from in OUTPUT_SOURCES,
        f"`output_from` must be one of {', '.join(repr(s) for s in OUTPUT_SOURCES)}",
        ("output_from",),
        suggest(output_from, OUTPUT_SOURCES) if isinstance(output_from, str) else None,
    )
    description, inputs, outputs = _declarations(raw)
    return _outside_agent(
        raw,
        fmt,
        text,
        name,
        AgentKind.PROCESS,
        lambda timeout: ProcessSettings(
            command=tuple(argv), cwd=cwd, env=dict(env), timeout=timeout
        ),
        description=description,
        inputs=inputs,
        outputs=outputs,
        salvor_mcp=salvor_mcp,
        output_from=output_from,
    )


def _outside_agent(
    raw: dict, fmt: str, text: str, name: str | None, kind: AgentKind, settings, **declared
) -> AgentDefinition:
    """What a process and a service definition share: the timeout, record_prompts, the hash.

    ``declared``: the process agent's flow fields (its description, inputs, outputs, the
    ``salvor`` MCP server and its result's source).
    """
    timeout = raw.get("timeout", DEFAULT_PROCESS_TIMEOUT)
    _duration("timeout", timeout, ("timeout",), MAX_PROCESS_TIMEOUT)
    record_prompts = _record_prompts(raw)
    try:
        # Reached through salvor's stand-ins (``_mcp_standin``), never by the agent itself.
        mcp_servers = (
            parse_mcp_servers(raw["mcp_servers"], stand_ins=True, probes=kind is AgentKind.PROCESS)
            if "mcp_servers" in raw
            else ()
        )
    except McpDefinitionError as exc:
        raise DefinitionError(str(exc), at=("mcp_servers",)) from None
    for index, server in enumerate(mcp_servers):
        # salvor serves its own `salvor` server to every process run: a second would share its
        # lane and its variables.
        _expect(
            variable_suffix(server.name) != "SALVOR",
            f"[[mcp_servers]] {server.name!r}: salvor offers every process agent its own MCP "
            "server named `salvor` (SALVOR_MCP_URL_SALVOR, SALVOR_MCP_SERVER_SALVOR); give this "
            "one another name",
            ("mcp_servers", index),
        )
    normalised = {k: v for k, v in raw.items() if k != "name"}
    return AgentDefinition(
        agent_def_hash=_hash(normalised),
        name=name,
        model="",
        system_prompt=None,
        max_response_tokens=0,
        record_prompts=record_prompts,
        llm=LlmSettings(),
        stored_format=fmt,
        stored_text=text,
        kind=kind,
        mcp_servers=mcp_servers,
        **{kind.value: settings(float(timeout))},
        **declared,
    )


def _check_placeholders(where: str, value: str, at: tuple[str | int, ...]) -> None:
    _expect(
        not stray_placeholder(value),
        f"{where} has a `${{` that is not a well-formed `${{NAME}}` placeholder",
        at,
    )


def _parse_service(raw: dict, fmt: str, text: str) -> AgentDefinition:
    """A ``kind = "service"`` definition: a running service triggered by a POST."""
    _check_keys("a service agent", raw, _SERVICE_TOP)
    name = _name(raw)
    url = raw.get("url")
    _expect(
        isinstance(url, str) and url != "",
        "a service agent needs `url`: the http(s) URL its trigger is POSTed to",
        ("url",),
    )
    _expect(
        is_http_url(url),
        f"`url` must be an http:// or https:// URL with a host, not {url!r}",
        ("url",),
    )
    proxy_port = raw.get("proxy_port")
    _expect(
        "proxy_port" in raw,
        "a service agent needs `proxy_port`: the loopback port its model calls go to",
    )
    _expect(
        _whole(proxy_port) and 1024 <= proxy_port <= 65535,
        "`proxy_port` must be an integer from 1024 to 65535",
        ("proxy_port",),
    )
    proxy_port = int(proxy_port)
    headers = raw.get("headers", {})
    _expect(isinstance(headers, dict), "`headers` must be a table of strings", ("headers",))
    for key, value in headers.items():
        at = ("headers", key)
        _expect(
            bool(HEADER_NAME.fullmatch(key)),
            f"`headers` key {key!r} is not an HTTP header name",
            at,
        )
        _expect(isinstance(value, str), f"`headers` value of {key} must be a string", at)
        _expect(
            "\r" not in value and "\n" not in value and "\0" not in value,
            f"`headers` value of {key} must be one line",
            at,
        )
        _check_placeholders(f"`headers` value of {key}", value, at)
    return _outside_agent(
        raw,
        fmt,
        text,
        name,
        AgentKind.SERVICE,
        lambda timeout: ServiceSettings(
            url=url, proxy_port=proxy_port, headers=dict(headers), timeout=timeout
        ),
    )


def format_of(path: str | Path) -> str:
    """The format an agent file's name says: ``.json`` is JSON, ``.md`` markdown, else TOML."""
    suffix = Path(path).suffix.lower()
    return {".json": "json", ".md": "md", ".markdown": "md"}.get(suffix, "toml")


def load_definition(path: str | Path, *, known_tools=()) -> AgentDefinition:
    """Read a definition file (``.json`` is JSON, ``.md`` markdown, anything else TOML).

    Raises:
        DefinitionError: the file cannot be read or does not validate.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DefinitionError(f"cannot read agent file {str(path)!r}: {exc.strerror}") from None
    return parse_definition(text, format_of(path), base_dir=path.parent, known_tools=known_tools)
