"""The definitions of agents salvor does not loop itself: a process it starts, a service it
triggers.

Each reaches its model through salvor's loopback proxy and its MCP servers through salvor's
stand-ins, so both share a tail (``_outside_agent``): a timeout, ``record_prompts``, the stand-in
MCP servers and the hash of everything but the name.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from ..mcp import McpDefinitionError, parse_mcp_servers
from ..proxies import variable_suffix
from ..skills import SkillLibrary
from ..tools import FILE_TOOLS
from ..web import HEADER_NAME, is_http_url
from ._agent_definition import (
    DEFAULT_PROCESS_TIMEOUT,
    AgentDefinition,
    AgentKind,
    LlmSettings,
    ProcessSettings,
    ServiceSettings,
)
from ._builtin_definition import file_access, file_tools_of
from ._definition_error import DefinitionError, suggest
from ._definition_reach import check_placeholders
from ._definition_rules import (
    MAX_PROCESS_TIMEOUT,
    check_keys,
    declarations,
    definition_hash,
    display_name,
    duration,
    expect,
    record_prompts,
    whole,
)
from ._skills_field import granted, skills_of

# A `command` element that a run replaces with its prompt, as one argument.
PROMPT_PLACEHOLDER = "{prompt}"
# Where a process agent's result comes from when it calls no finish.
OUTPUT_SOURCES = ("model", "stdout")
PROCESS_FIELDS = {
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
    "tools",
    "access",
    "skills",
}
SERVICE_FIELDS = {"name", "kind", "url", "proxy_port", "headers", "timeout", "record_prompts"}


def process_agent(
    raw: dict,
    fmt: str,
    text: str,
    known_tools=(),
    stored: bool = False,
    library: SkillLibrary | None = None,
) -> AgentDefinition:
    """A ``kind = "process"`` definition: a local command driven through the model proxy.

    Its ``tools`` are file tools alone (``known_tools``: those the daemon offers), reached
    through the ``salvor`` MCP server, so they need it on; so do its ``skills`` (advertised in
    the server's instructions, read with its ``read``)."""
    check_keys("a process agent", raw, PROCESS_FIELDS)
    name = display_name(raw)
    argv = _argv(raw.get("command"))
    cwd = raw.get("cwd")
    expect(
        cwd is None or (isinstance(cwd, str) and cwd != ""),
        "`cwd` must be a non-empty string",
        ("cwd",),
    )
    env = _env(raw.get("env", {}))
    salvor_mcp = raw.get("salvor_mcp", True)
    expect(isinstance(salvor_mcp, bool), "`salvor_mcp` must be true or false", ("salvor_mcp",))
    output_from = raw.get("output_from", "model")
    expect(
        output_from in OUTPUT_SOURCES,
        f"`output_from` must be one of {', '.join(repr(s) for s in OUTPUT_SOURCES)}",
        ("output_from",),
        suggest(output_from, OUTPUT_SOURCES) if isinstance(output_from, str) else None,
    )
    description, inputs, outputs = declarations(raw)
    tools = file_tools_of(raw.get("tools", []), [n for n in known_tools if n in FILE_TOOLS], stored)
    expect(
        salvor_mcp or not tools,
        "a process agent reaches its file tools through salvor's MCP server, which "
        "`salvor_mcp = false` turns off",
        ("tools",),
    )
    skills = skills_of(raw, library, stored)
    expect(
        salvor_mcp or not skills,
        "a process agent learns of its skills and reads them through salvor's MCP server, which "
        "`salvor_mcp = false` turns off",
        ("skills",),
    )
    return _outside_agent(
        raw,
        fmt,
        text,
        name,
        AgentKind.PROCESS,
        lambda timeout: ProcessSettings(command=argv, cwd=cwd, env=env, timeout=timeout),
        description=description,
        inputs=inputs,
        outputs=outputs,
        salvor_mcp=salvor_mcp,
        output_from=output_from,
        tools=tuple(granted(tools, skills)),
        access=file_access(raw),
        skills=skills,
    )


def _argv(command: object) -> tuple[str, ...]:
    """``command``: an array of strings, or one string split as a shell would; the prompt's
    placeholder only ever a whole argument."""
    at = ("command",)
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise DefinitionError(
                f"`command` cannot be split into arguments: {exc}", at=at
            ) from None
    elif isinstance(command, list):
        expect(
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
    expect(
        bool(argv) and argv[0] not in ("", PROMPT_PLACEHOLDER), "`command` must name a program", at
    )
    for index, arg in enumerate(argv):
        # Replaced only whole: inside a longer argument (`sh -c "llm {prompt}"`) the task's
        # text would be parsed by whatever reads that argument, a shell among them.
        expect(
            arg == PROMPT_PLACEHOLDER or PROMPT_PLACEHOLDER not in arg,
            f"`command` argument {index} holds {PROMPT_PLACEHOLDER} inside other text; it is "
            "replaced only as a whole argument (the prompt becomes exactly one argument, never "
            "shell text): give it an element of its own",
            (*at, index),
        )
    return tuple(argv)


def _env(env: object) -> dict:
    """``env``: variables set for the process as written (salvor fills nothing in)."""
    expect(isinstance(env, dict), "`env` must be a table of strings", ("env",))
    for key, value in env.items():
        expect(
            key != "" and "=" not in key and "\0" not in key,
            f"`env` key {key!r} is not a variable name",
            ("env", key),
        )
        expect(isinstance(value, str), f"`env` value of {key} must be a string", ("env", key))
    return dict(env)


def service_agent(raw: dict, fmt: str, text: str) -> AgentDefinition:
    """A ``kind = "service"`` definition: a running service triggered by a POST."""
    check_keys("a service agent", raw, SERVICE_FIELDS)
    name = display_name(raw)
    url = raw.get("url")
    expect(
        isinstance(url, str) and url != "",
        "a service agent needs `url`: the http(s) URL its trigger is POSTed to",
        ("url",),
    )
    expect(
        is_http_url(url),
        f"`url` must be an http:// or https:// URL with a host, not {url!r}",
        ("url",),
    )
    proxy_port = raw.get("proxy_port")
    expect(
        "proxy_port" in raw,
        "a service agent needs `proxy_port`: the loopback port its model calls go to",
    )
    expect(
        whole(proxy_port) and 1024 <= proxy_port <= 65535,
        "`proxy_port` must be an integer from 1024 to 65535",
        ("proxy_port",),
    )
    headers = _headers(raw.get("headers", {}))
    return _outside_agent(
        raw,
        fmt,
        text,
        name,
        AgentKind.SERVICE,
        lambda timeout: ServiceSettings(
            url=url, proxy_port=int(proxy_port), headers=headers, timeout=timeout
        ),
    )


def _headers(headers: object) -> dict:
    """``headers``: one-line values, their ``${VAR}`` placeholders well formed (resolved from the
    daemon's environment at each trigger, never stored)."""
    expect(isinstance(headers, dict), "`headers` must be a table of strings", ("headers",))
    for key, value in headers.items():
        at = ("headers", key)
        expect(
            bool(HEADER_NAME.fullmatch(key)),
            f"`headers` key {key!r} is not an HTTP header name",
            at,
        )
        expect(isinstance(value, str), f"`headers` value of {key} must be a string", at)
        expect(
            "\r" not in value and "\n" not in value and "\0" not in value,
            f"`headers` value of {key} must be one line",
            at,
        )
        check_placeholders(f"`headers` value of {key}", value, at)
    return dict(headers)


def _outside_agent(
    raw: dict,
    fmt: str,
    text: str,
    name: str | None,
    kind: AgentKind,
    settings: Callable[[float], ProcessSettings | ServiceSettings],
    **declared,
) -> AgentDefinition:
    """What a process and a service definition share: the timeout, record_prompts, the hash.

    ``declared``: the process agent's flow fields (its description, inputs, outputs, the
    ``salvor`` MCP server and its result's source).
    """
    timeout = raw.get("timeout", DEFAULT_PROCESS_TIMEOUT)
    duration("timeout", timeout, ("timeout",), MAX_PROCESS_TIMEOUT)
    recorded = record_prompts(raw)
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
        expect(
            variable_suffix(server.name) != "SALVOR",
            f"[[mcp_servers]] {server.name!r}: salvor offers every process agent its own MCP "
            "server named `salvor` (SALVOR_MCP_URL_SALVOR, SALVOR_MCP_SERVER_SALVOR); give this "
            "one another name",
            ("mcp_servers", index),
        )
    normalised = {k: v for k, v in raw.items() if k != "name"}
    return AgentDefinition(
        agent_def_hash=definition_hash(normalised),
        name=name,
        model="",
        system_prompt=None,
        max_response_tokens=0,
        record_prompts=recorded,
        llm=LlmSettings(),
        stored_format=fmt,
        stored_text=text,
        kind=kind,
        mcp_servers=mcp_servers,
        **{kind.value: settings(float(timeout))},
        **declared,
    )
