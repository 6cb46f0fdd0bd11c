"""The ``[[mcp_servers]]`` tables of a built-in agent definition, validated strictly.

Every rule here is static: it reads the definition only, never the server.
What needs the server (the tool names it lists, collisions between them) is
checked when the agent is built (``_mcp_tools.build_agent_tools``).

A server is reached over stdio (``command``: a program the daemon spawns) or
over streamable HTTP (``url``). Header values may name daemon variables as
``${NAME}``; they are kept unresolved here, so ``agent_def_hash`` covers the
headers as written and a secret is never part of a stored definition.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from salvor.protocol import Effect

from ..tools import Probe, check_key_paths, check_path
from ..web import HEADER_NAME, PLACEHOLDER, is_http_url, stray_placeholder

DEFAULT_MCP_TIMEOUT = 60.0
# The longest a server's `timeout` may be, in seconds: a bound against nonsense (1e300 overflows
# the first timer it reaches), far past one tool call; work longer than a day is a job a tool
# starts and another polls.
MAX_MCP_TIMEOUT = 86400.0
# A server's name becomes part of a tool-listing call's name in the log and,
# for process agents, of a variable name: keep it to a safe alphabet.
_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FIELDS = {
    "name",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "bearer_token_env",
    "effects",
    "effect_overrides",
    "results",
    "tools",
    "timeout",
    "idempotency_keys",
    "probes",
}
_PROBE_FIELDS = {"tool", "input", "landed", "output"}
# Only a process agent's servers, which it reaches through salvor's stand-ins.
_STAND_IN_FIELDS = {"port"}
# What an entry may give, as the OpenAPI document describes it: `port` only for a process agent's
# servers.
SERVER_FIELDS = frozenset(_FIELDS)
STAND_IN_FIELDS = frozenset(_STAND_IN_FIELDS)
_EFFECTS = tuple(e.value for e in Effect)


class McpDefinitionError(ValueError):
    """One ``[[mcp_servers]]`` entry does not validate; the message names the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class McpServerSpec:
    """One MCP server of a built-in agent, as declared."""

    name: str
    command: tuple[str, ...] | None = None
    env: dict = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    # Header name -> value with ``${VAR}`` placeholders still unresolved.
    headers: dict = field(default_factory=dict)
    bearer_token_env: str | None = None
    effects: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    tools: tuple[str, ...] | None = None
    # Tool name -> the dotted input paths its calls' identity is made of.
    idempotency_keys: dict = field(default_factory=dict)
    # Write tool name -> the ``Probe`` (a read on this server) that tells whether it landed.
    probes: dict = field(default_factory=dict)
    timeout: float = DEFAULT_MCP_TIMEOUT
    # A process agent's url server only: the fixed loopback port its stand-in listens on.
    port: int | None = None

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def effect_of(self, tool: str) -> Effect:
        """The operator's declared effect; a tool nobody declared is a ``write``."""
        return Effect(self.effects.get(tool, Effect.WRITE.value))

    def key_paths(self, tool: str) -> tuple[str, ...]:
        """The declared key fields of ``tool`` (empty when it declares none)."""
        return self.idempotency_keys.get(tool, ())

    def probe_of(self, tool: str) -> Probe | None:
        """The declared probe of ``tool`` (None when it declares none)."""
        return self.probes.get(tool)

    def exposes(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools

    def reads_environment(self) -> bool:
        """Whether connecting reads the daemon's environment (a header secret)."""
        return self.bearer_token_env is not None or any(
            PLACEHOLDER.search(v) for v in self.headers.values()
        )


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise McpDefinitionError(message)


def _string_table(where: str, value: Any) -> dict:
    _expect(isinstance(value, dict), f"{where} must be a table of strings")
    for key, item in value.items():
        _expect(isinstance(item, str), f"{where} value of {key} must be a string")
    return dict(value)


def _command(where: str, entry: dict) -> tuple[str, ...]:
    command = entry["command"]
    args = entry.get("args")
    if args is not None:
        # The reference's file format: a program in `command`, its arguments in `args`.
        _expect(
            isinstance(command, str),
            f"{where} `command` must be one program name when `args` is given",
        )
        _expect(
            isinstance(args, list) and all(isinstance(a, str) for a in args),
            f"{where} `args` must be an array of strings",
        )
        argv = [command, *args]
    elif isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise McpDefinitionError(
                f"{where} `command` cannot be split into arguments: {exc}"
            ) from None
    elif isinstance(command, list):
        _expect(
            all(isinstance(a, str) for a in command),
            f"{where} `command` must be an array of strings",
        )
        argv = list(command)
    else:
        raise McpDefinitionError(
            f"{where} `command` must be an array of strings, or one string split as a shell would"
        )
    _expect(bool(argv) and argv[0] != "", f"{where} `command` must name a program")
    _expect(all("\0" not in a for a in argv), f"{where} `command` must not hold a NUL character")
    return tuple(argv)


def _headers(where: str, value: Any) -> dict:
    headers = _string_table(f"{where} `headers`", value)
    for key, item in headers.items():
        _expect(
            bool(HEADER_NAME.fullmatch(key)),
            f"{where} `headers` key {key!r} is not an HTTP header name",
        )
        _expect(
            "\r" not in item and "\n" not in item and "\0" not in item,
            f"{where} `headers` value of {key} must be one line",
        )
        # Every "${" must open a well-formed placeholder, or a typo goes out verbatim.
        _expect(
            not stray_placeholder(item),
            f"{where} `headers` value of {key} has a `${{` that is not a "
            "well-formed `${NAME}` placeholder",
        )
    return headers


def _tool_names(where: str, value: Any) -> tuple[str, ...]:
    _expect(
        isinstance(value, list) and all(isinstance(t, str) and t for t in value),
        f"{where} `tools` must be an array of tool names",
    )
    duplicate = next((t for i, t in enumerate(value) if t in value[:i]), None)
    _expect(duplicate is None, f"{where} `tools` lists {duplicate!r} twice")
    return tuple(value)


def _idempotency_keys(where: str, value: Any) -> dict:
    # A tool name the server may not list is fine here: its tools are known
    # only when it runs, and a key of a tool never called is never used.
    _expect(
        isinstance(value, dict),
        f"{where} `idempotency_keys` must be a table of tool name -> a dotted input path "
        "or an array of them",
    )
    keys = {}
    for tool, paths in value.items():
        try:
            keys[tool] = check_key_paths(
                f"{where} `idempotency_keys` entry {tool!r}",
                [paths] if isinstance(paths, str) else paths,
            )
        except ValueError as exc:
            raise McpDefinitionError(str(exc)) from None
    return keys


def _probe(where: str, value: Any) -> Probe:
    _expect(
        isinstance(value, dict),
        f"{where} must be a table with `tool`, `input`, `landed` and optionally `output`",
    )
    unknown = sorted(set(value) - _PROBE_FIELDS)
    _expect(
        not unknown,
        f"{where} has the unknown field `{unknown[0] if unknown else ''}`; "
        "allowed: input, landed, output, tool",
    )
    missing = sorted({"tool", "input", "landed"} - set(value))
    _expect(not missing, f"{where} needs `{missing[0] if missing else ''}`")
    _expect(
        isinstance(value["tool"], str) and value["tool"] != "",
        f"{where} `tool` must name a tool of this server",
    )
    probe_input = value["input"]
    _expect(
        isinstance(probe_input, dict) and all(probe_input),
        f"{where} `input` must be a table of probe input field -> a dotted path into the "
        "write's input",
    )
    try:
        for name, path in probe_input.items():
            check_path(f"{where} `input` entry {name!r}", path)
        check_path(f"{where} `landed`", value["landed"])
        if "output" in value:
            check_path(f"{where} `output`", value["output"])
    except ValueError as exc:
        raise McpDefinitionError(str(exc)) from None
    return Probe(
        tool=value["tool"],
        input=dict(probe_input),
        landed=value["landed"],
        output=value.get("output"),
    )


def _probes(where: str, value: Any, effects: dict, tools: tuple[str, ...] | None) -> dict:
    # Checked against the declarations, not the server: a probe must be a
    # read the operator declared, on a write the operator declared.
    _expect(
        isinstance(value, dict),
        f"{where} `probes` must be a table of write tool name -> its probe "
        "([mcp_servers.probes.TOOL])",
    )
    probes = {}
    for tool, table in value.items():
        entry = f"{where} `probes.{tool}`"
        _expect(
            effects.get(tool) == "write",
            f"{entry} probes a tool not declared `write` in `effects`; only a write has a probe",
        )
        probe = _probe(entry, table)
        _expect(
            tools is None or probe.tool in tools,
            f"{entry} names the probe {probe.tool!r}, which `tools` does not expose",
        )
        _expect(
            effects.get(probe.tool) == "read",
            f"{entry} names the probe {probe.tool!r}, which is not declared `read` in `effects`",
        )
        probes[tool] = probe
    return probes


def _stdio_fields(where: str, entry: dict) -> dict[str, Any]:
    """The fields of a stdio (``command``) server, checked."""
    spec: dict[str, Any] = {}
    for key in ("headers", "bearer_token_env"):
        _expect(key not in entry, f"{where} `{key}` belongs to a `url` server, not a stdio one")
    spec["command"] = _command(where, entry)
    env = _string_table(f"{where} `env`", entry.get("env", {}))
    for key in env:
        _expect(
            key != "" and "=" not in key and "\0" not in key,
            f"{where} `env` key {key!r} is not a variable name",
        )
        _expect("\0" not in env[key], f"{where} `env` value of {key} must not hold a NUL character")
    spec["env"] = env
    cwd = entry.get("cwd")
    _expect(
        cwd is None or (isinstance(cwd, str) and cwd != ""),
        f"{where} `cwd` must be a non-empty string",
    )
    spec["cwd"] = cwd
    return spec


def _url_fields(where: str, entry: dict) -> dict[str, Any]:
    """The fields of a streamable-HTTP (``url``) server, checked."""
    spec: dict[str, Any] = {}
    for key in ("args", "env", "cwd"):
        _expect(
            key not in entry,
            f"{where} `{key}` belongs to a stdio (`command`) server, not a `url` one",
        )
    url = entry["url"]
    _expect(
        isinstance(url, str) and is_http_url(url),
        f"{where} `url` must be an http:// or https:// URL with a host",
    )
    spec["url"] = url
    spec["headers"] = _headers(where, entry.get("headers", {}))
    token_env = entry.get("bearer_token_env")
    if token_env is not None:
        _expect(
            isinstance(token_env, str) and bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token_env)),
            f"{where} `bearer_token_env` must name an environment variable",
        )
        _expect(
            all(k.lower() != "authorization" for k in spec["headers"]),
            f"{where} give `bearer_token_env` or an `Authorization` header, not both",
        )
        spec["bearer_token_env"] = token_env
    return spec


def _parse_entry(index: int, entry: Any, stand_ins: bool, probes: bool) -> McpServerSpec:
    name = _entry_name(index, entry, _FIELDS | _STAND_IN_FIELDS if stand_ins else _FIELDS)
    where = f"[[mcp_servers]] {name!r}:"
    _expect(
        probes or "probes" not in entry,
        f"{where} `probes` is not supported for a service agent's servers by this build yet: "
        "a service's calls reach its servers through stand-ins that probe nothing",
    )
    has_command, has_url = "command" in entry, "url" in entry
    _expect(
        has_command != has_url,
        f"{where} give exactly one of `command` (a stdio server) or "
        "`url` (a streamable-HTTP server)",
    )
    spec: dict[str, Any] = {"name": name}
    if "port" in entry:
        spec["port"] = _port(where, entry["port"], has_url)
    spec.update(_stdio_fields(where, entry) if has_command else _url_fields(where, entry))
    effects_key, effects = _effects(where, entry)
    spec["effects"] = dict(effects)
    results = entry.get("results", {})
    _expect(
        isinstance(results, dict),
        f"{where} `results` must be a table of tool name -> the fixed result",
    )
    spec["results"] = dict(results)
    spec["idempotency_keys"] = _idempotency_keys(where, entry.get("idempotency_keys", {}))
    if "tools" in entry:
        spec["tools"] = _tool_names(where, entry["tools"])
        for table, names in ((effects_key, effects), ("results", results)):
            hidden = next((t for t in names if t not in spec["tools"]), None)
            _expect(
                hidden is None, f"{where} `{table}` names {hidden!r}, which `tools` does not expose"
            )
    spec["probes"] = _probes(where, entry.get("probes", {}), spec["effects"], spec.get("tools"))
    spec["timeout"] = _timeout(where, entry.get("timeout", DEFAULT_MCP_TIMEOUT))
    return McpServerSpec(**spec)


def _entry_name(index: int, entry: Any, fields: set[str]) -> str:
    """Entry ``index``'s name, once it is a table of ``fields`` only."""
    where = f"[[mcp_servers]] #{index + 1}"
    _expect(isinstance(entry, dict), f"{where} must be a table")
    unknown = sorted(set(entry) - fields)
    _expect(
        not unknown,
        f"unknown field `{unknown[0] if unknown else ''}` in {where}; allowed: "
        f"{', '.join(sorted(fields))}",
    )
    # Unnamed servers (the reference's file format names none) are called by position.
    name = entry.get("name", f"server{index + 1}")
    _expect(
        isinstance(name, str) and bool(_SERVER_NAME.fullmatch(name)),
        f"{where} `name` must be 1 to 64 letters, digits, `_` or `-`",
    )
    return name


def _port(where: str, port: Any, has_url: bool) -> int:
    """A stand-in's fixed ``port``, for a ``url`` server only."""
    _expect(
        has_url,
        f"{where} `port` belongs to a `url` server: a stdio server is spawned, not dialed",
    )
    _expect(
        type(port) is int and 1 <= port <= 65535,
        f"{where} `port` must be a port number from 1 to 65535",
    )
    return port


def _effects(where: str, entry: dict) -> tuple[str, dict]:
    """``effects`` (or its other name, ``effect_overrides``): the field's name as given, and the
    table of tool name -> effect."""
    _expect(
        not ("effects" in entry and "effect_overrides" in entry),
        f"{where} `effects` and `effect_overrides` are the same field; give one",
    )
    effects_key = "effect_overrides" if "effect_overrides" in entry else "effects"
    effects = entry.get(effects_key, {})
    _expect(
        isinstance(effects, dict), f"{where} `{effects_key}` must be a table of tool name -> effect"
    )
    for tool, effect in effects.items():
        _expect(
            effect in _EFFECTS,
            f"{where} `{effects_key}` gives {tool!r} the effect "
            f"{effect!r}; use read, idempotent or write",
        )
    return effects_key, effects


def _timeout(where: str, timeout: Any) -> float:
    _expect(
        type(timeout) in (int, float) and 0 < timeout <= MAX_MCP_TIMEOUT,
        f"{where} `timeout` must be a positive, finite number of seconds, at most "
        f"{MAX_MCP_TIMEOUT:.0f} (1 day)",
    )
    return float(timeout)


def parse_mcp_servers(
    value: Any, *, stand_ins: bool = False, probes: bool = True
) -> tuple[McpServerSpec, ...]:
    """Validate the ``mcp_servers`` array of a definition.

    ``stand_ins``: the servers of a process agent, which reaches them through
    salvor's stand-ins (and so may fix a `url` server's stand-in ``port``).
    ``probes``: whether the servers may declare ``probes`` (a service agent's may not).

    Raises:
        McpDefinitionError: one sentence naming the entry and the field.
    """
    _expect(isinstance(value, list), "`mcp_servers` must be an array of tables ([[mcp_servers]])")
    servers = [_parse_entry(i, entry, stand_ins, probes) for i, entry in enumerate(value)]
    names = [s.name for s in servers]
    duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
    _expect(
        duplicate is None,
        f"two [[mcp_servers]] are named {duplicate!r}; a server's name must be unique",
    )
    if stand_ins:
        # Each name becomes a variable suffix (upper-cased, `-` as
        # `_`): two names must not share one.
        seen: dict[str, str] = {}
        for name in names:
            suffix = name.upper().replace("-", "_")
            _expect(
                suffix not in seen,
                f"the [[mcp_servers]] {seen.get(suffix)!r} and {name!r} would share the "
                f"variable SALVOR_MCP_SERVER_{suffix}; rename one",
            )
            seen[suffix] = name
    return tuple(servers)
