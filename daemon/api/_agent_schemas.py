"""The OpenAPI document's agent definitions: built-in, process and service agents and their MCP
servers, as JSON Schema.

Each table's properties are tied to the fields the parser takes (``exactly``: ``HTTP_FIELDS``,
``SERVER_FIELDS``, ``STAND_IN_FIELDS``), so a field the parser gains or drops fails at import until
the schema describes it. Plain data, built at import.
"""

from __future__ import annotations

from salvor.protocol import OUTPUT_TYPES, FlowTool

from ..agents import (
    HTTP_FIELDS,
    MAX_DESCRIPTION_CHARS,
    MAX_LLM_TIMEOUT,
    MAX_PROCESS_TIMEOUT,
    MAX_WALL_TIME_BUDGET,
    OUTPUT_SOURCES,
    PROVIDERS,
)
from ..files import GLOB_PATTERN, MAX_GLOB_CHARS, MAX_GLOBS
from ..mcp import MAX_MCP_TIMEOUT, SERVER_FIELDS, STAND_IN_FIELDS
from ..skills import SKILL_NAME
from ..tools import FILE_TOOLS
from ._schema import ANY as _ANY
from ._schema import JSON
from ._schema import closed as _object
from ._schema import exactly as _exactly
from ._schema import nullable as _nullable
from ._schema import ref as _ref

# Python's str.strip() and JSON Schema's \\s disagree at the edges; a visible character settles it.
NOT_BLANK = "[^\\s\\u001c-\\u001f\\u0085]"
_NAME = {
    "type": "string",
    "maxLength": 64,
    "pattern": NOT_BLANK,
    "description": "A display label, excluded from the agent hash.",
}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0}


def _seconds(most: float, said: str) -> JSON:
    """A positive number of seconds, at most ``most`` (``said``, as a refusal words it)."""
    return {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": int(most),
        "description": f"Seconds, at most {most:.0f} ({said}).",
    }


_PROCESS_TIMEOUT = _seconds(*MAX_PROCESS_TIMEOUT)
# What Python's str.isspace() calls whitespace, which an http(s) URL here must not hold anywhere.
_SPACE = "\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
_PORT = "0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
# No bracket in the user part either: urlsplit refuses a netloc holding one without the other.
_HTTP_URL = (
    f"^[hH][tT][tT][pP][sS]?://([^/?#@\\[\\]{_SPACE}]*@)?[^/?#@:\\[\\]{_SPACE}\\u0000-\\u001f]+"
    f"(:{_PORT})?([/?#][^{_SPACE}]*)?$"
)
# One line, and every `${` opens a well-formed `${NAME}`.
_HEADER_VALUE = "^([^\\r\\n\\u0000$]|\\$(?!\\{)|\\$\\{[A-Za-z_][A-Za-z0-9_]*\\})*$"
_NON_NEGATIVE = {"type": "number", "minimum": 0}
_DESCRIPTION = {
    "type": "string",
    "maxLength": MAX_DESCRIPTION_CHARS,
    "description": "What the agent does, for the catalog a subagent call picks from.",
}
# What an agent declares for the flow tools, built-in and process agents alike.
_DECLARED = {
    "description": _DESCRIPTION,
    "inputs": _ref("DeclaredInputs"),
    "outputs": _ref("DeclaredOutputs"),
}
# A declared input's or output's name (``protocol.parse_inputs``).
_DECLARED_NAME = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"}
# The names a finish keeps for itself, which no output may take.
_OUTPUT_NAME = {**_DECLARED_NAME, "not": {"enum": ["status", "summary", "branch", "outputs"]}}

# Where an agent's file tools may read and write (built-in and process agents alike).
_ACCESS = _object(
    {
        kind: {
            "type": "array",
            "maxItems": MAX_GLOBS,
            "items": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_GLOB_CHARS,
                "pattern": GLOB_PATTERN,
            },
            "description": f"Globs relative to the workspace the file tools may {kind} "
            f"({default}).",
        }
        for kind, default in (("read", "absent: every file"), ("write", "absent: none"))
    }
)

# The skills an agent declares (built-in and process agents alike): `read` comes with them.
_SKILLS = {
    "type": "array",
    "uniqueItems": True,
    "items": _ref("SkillName"),
    "description": "Skills the agent is told of (name, description, where its SKILL.md is) and "
    "may read with `read`, which declaring one grants.",
}


AGENT_SCHEMAS: JSON = {
    "AgentDefinition": {
        "description": (
            "An agent as JSON: the same fields as the TOML file; unknown fields are refused. A "
            "built-in agent, or (only on a daemon started with "
            "--allow-process-agents) a process or service agent."
        ),
        "oneOf": [_ref("BuiltinAgent"), _ref("ProcessAgent"), _ref("ServiceAgent")],
    },
    "BuiltinAgent": {
        "description": "An agent the daemon's own loop drives. `system_prompt_path` is read only "
        "from agent files on the daemon's disk, never over HTTP.",
        **_object(
            _exactly(
                "a built-in agent",
                HTTP_FIELDS["builtin"],
                {
                    "name": _nullable(_NAME),
                    "model": {"type": "string", "pattern": NOT_BLANK},
                    "system_prompt": _nullable({"type": "string"}),
                    "max_response_tokens": {"type": "integer", "minimum": 1},
                    "record_prompts": {"type": "boolean"},
                    "llm": _object(
                        _exactly(
                            # No `base_url_env` over HTTP: it would make the daemon read a
                            # variable a caller chose.
                            "[llm]",
                            HTTP_FIELDS["llm"],
                            {
                                "provider": {"enum": list(PROVIDERS)},
                                "base_url": {
                                    "type": "string",
                                    "description": "An endpoint the operator declared "
                                    "(the served document lists them); any with provider `demo`.",
                                },
                                "api_key_env": {
                                    "type": "string",
                                    "description": "Absent, or the variable the operator "
                                    "bound to the endpoint (the served document names it).",
                                },
                                "max_retries": {"type": "integer", "minimum": 0, "maximum": 20},
                                "timeout_seconds": _seconds(*MAX_LLM_TIMEOUT),
                                "stream": {"type": "boolean"},
                            },
                        )
                    ),
                    "budgets": _object(
                        {
                            kind: _seconds(*MAX_WALL_TIME_BUDGET)
                            if kind == "wall_time_seconds"
                            else _POSITIVE
                            for kind in HTTP_FIELDS["budgets"]
                        }
                    ),
                    "pricing": _nullable(
                        _object(
                            _exactly(
                                "[pricing]",
                                HTTP_FIELDS["pricing"],
                                {"input_per_mtok": _NON_NEGATIVE, "output_per_mtok": _NON_NEGATIVE},
                            ),
                            ["input_per_mtok", "output_per_mtok"],
                        )
                    ),
                    "output_schema": _nullable(
                        {"type": "object", "description": "A JSON Schema the answer must satisfy."}
                    ),
                    "tools": {
                        "type": "array",
                        "uniqueItems": True,
                        "items": _object(
                            _exactly(
                                "[[tools]]",
                                HTTP_FIELDS["tools"],
                                {"name": {"$ref": "#/components/schemas/ToolName"}},
                            ),
                            ["name"],
                        ),
                    },
                    "mcp_servers": {"type": "array", "items": _ref("McpServer")},
                    "access": _ACCESS,
                    "skills": _SKILLS,
                    "flow_tools": {
                        "type": "array",
                        "uniqueItems": True,
                        "items": {"enum": [tool.value for tool in FlowTool]},
                        "description": "The flow tools the agent opts into; a run sees those its "
                        "session offers (ask_user, subagent, flow_results and the authoring "
                        "tools in a top-level run; ask_user and finish in a child run).",
                    },
                    **_DECLARED,
                },
            ),
            ["model"],
        ),
        # A cost budget is priced by the agent's own [pricing].
        "if": {"required": ["budgets"], "properties": {"budgets": {"required": ["cost_usd"]}}},
        "then": {"required": ["pricing"], "properties": {"pricing": {"type": "object"}}},
    },
    "DeclaredInputs": {
        "type": "array",
        "description": "The named inputs a subagent call passes the agent.",
        "items": {
            "oneOf": [
                _DECLARED_NAME,
                _object({"name": _DECLARED_NAME, "description": {"type": "string"}}, ["name"]),
            ]
        },
    },
    "DeclaredOutputs": {
        "type": "array",
        "description": "The typed outputs the agent's finish carries (required ones when its "
        "status is complete).",
        "items": {
            "oneOf": [
                _OUTPUT_NAME,
                _object(
                    {
                        "name": _OUTPUT_NAME,
                        "type": {"enum": list(OUTPUT_TYPES), "default": "string"},
                        "description": {"type": "string"},
                        "required": {"type": "boolean", "default": True},
                    },
                    ["name"],
                ),
            ]
        },
    },
    "ToolName": {
        "type": "string",
        "minLength": 1,
        "description": "A tool the daemon's registry holds.",
    },
    "SkillName": {
        "type": "string",
        "pattern": SKILL_NAME,
        "description": "A skill the daemon's skill directories hold (--skills-dir, then those "
        "salvor ships).",
    },
    "FileToolName": {
        "type": "string",
        "enum": list(FILE_TOOLS),
        "description": "A file tool the daemon offers (its workspace's; `bash` only with "
        "--allow-bash).",
    },
    "ProcessAgent": {
        "description": "A local program the daemon starts for each run, its model calls and MCP "
        "servers pointed at salvor's loopback proxies.",
        **_object(
            _exactly(
                "a process agent",
                HTTP_FIELDS["process"],
                {
                    "name": _nullable(_NAME),
                    "kind": {"const": "process"},
                    "command": {
                        "oneOf": [
                            {
                                "type": "string",
                                "pattern": NOT_BLANK,
                                "description": "Split into arguments as a POSIX shell would.",
                            },
                            {
                                "type": "array",
                                "minItems": 1,
                                "prefixItems": [{"type": "string", "minLength": 1}],
                                "items": {"type": "string"},
                            },
                        ]
                    },
                    "cwd": _nullable({"type": "string", "minLength": 1}),
                    "env": {
                        "type": "object",
                        "propertyNames": {"pattern": "^[^=\\u0000]+$"},
                        "additionalProperties": {"type": "string"},
                    },
                    "timeout": _PROCESS_TIMEOUT,
                    "record_prompts": {"type": "boolean"},
                    "mcp_servers": {"type": "array", "items": _ref("McpServer")},
                    "salvor_mcp": {
                        "type": "boolean",
                        "description": "Whether the `salvor` MCP server (the flow tools) is "
                        "offered to the process; default true.",
                    },
                    "output_from": {
                        "enum": list(OUTPUT_SOURCES),
                        "description": "The run's output when the process calls no finish: its "
                        "last model answer (`model`, the default) or what it printed (`stdout`).",
                    },
                    "tools": {
                        "type": "array",
                        "uniqueItems": True,
                        "description": "File tools (read, ls, find, grep, write, edit, bash) the "
                        "`salvor` MCP server offers the process, on a daemon with a workspace.",
                        "items": _object(
                            {"name": {"$ref": "#/components/schemas/FileToolName"}}, ["name"]
                        ),
                    },
                    "access": _ACCESS,
                    "skills": _SKILLS,
                    **_DECLARED,
                },
            ),
            ["kind", "command"],
        ),
        # Skills are advertised and read through the `salvor` MCP server.
        "if": {"required": ["salvor_mcp"], "properties": {"salvor_mcp": {"const": False}}},
        "then": {"properties": {"skills": {"maxItems": 0}}},
    },
    "ServiceAgent": {
        "description": "A service that is already running: each run POSTs its trigger to `url`, "
        "and its model calls come to the loopback `proxy_port` the daemon binds for the run.",
        **_object(
            _exactly(
                "a service agent",
                HTTP_FIELDS["service"],
                {
                    "name": _nullable(_NAME),
                    "kind": {"const": "service"},
                    "url": {
                        "type": "string",
                        "pattern": _HTTP_URL,
                        "description": "On an origin the operator declared "
                        "(`salvor serve --service-origin ORIGIN`).",
                    },
                    "proxy_port": {"type": "integer", "minimum": 1024, "maximum": 65535},
                    "headers": {
                        "type": "object",
                        "propertyNames": {"pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"},
                        "additionalProperties": {"type": "string", "pattern": _HEADER_VALUE},
                        "description": (
                            "`${VAR}` names only a variable the operator bound to the url's "
                            "origin (`--service-origin ORIGIN,header_env=VAR`); it is read from "
                            "the daemon's environment when it POSTs."
                        ),
                    },
                    "timeout": _PROCESS_TIMEOUT,
                    "record_prompts": {"type": "boolean"},
                },
            ),
            ["kind", "url", "proxy_port"],
        ),
    },
    "McpServer": {
        "description": (
            "An MCP server whose tools a built-in agent calls: `command` (stdio, spawned by the "
            "daemon) or `url` (streamable HTTP). Registration starts or reaches it, lists its "
            "tools and checks every name given here. A tool's effect is its `effects` entry, else "
            "write; a tool in `results` is answered with that value and never sent to the server. "
            "A process agent's servers are reached through salvor's stand-ins "
            "(`SALVOR_MCP_SERVER_<NAME>`, `SALVOR_MCP_URL_<NAME>` in its environment) and "
            "are not started at registration."
        ),
        **_object(
            _exactly(
                "[[mcp_servers]]",
                SERVER_FIELDS | STAND_IN_FIELDS,
                {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                    "command": {
                        "oneOf": [
                            {"type": "string"},
                            {"type": "array", "items": {"type": "string"}, "minItems": 1},
                        ]
                    },
                    "args": {"type": "array", "items": {"type": "string"}},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "cwd": {"type": "string", "minLength": 1},
                    "url": {"type": "string", "format": "uri"},
                    "headers": {
                        "type": "object",
                        "additionalProperties": {"type": "string"},
                        "description": (
                            "`${VAR}` names only a variable the operator bound to the url's "
                            "origin (`--mcp-origin ORIGIN,header_env=VAR`); it is read from the "
                            "daemon's environment when it connects."
                        ),
                    },
                    "bearer_token_env": {"type": "string"},
                    "effects": {
                        "type": "object",
                        "additionalProperties": {"enum": ["read", "idempotent", "write"]},
                    },
                    "effect_overrides": {
                        "type": "object",
                        "additionalProperties": {"enum": ["read", "idempotent", "write"]},
                    },
                    "results": {"type": "object", "additionalProperties": _ANY},
                    "tools": {"type": "array", "items": {"type": "string"}},
                    "idempotency_keys": {
                        "type": "object",
                        "additionalProperties": {
                            "oneOf": [
                                {"type": "string"},
                                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                            ]
                        },
                        "description": "Tool name -> the dotted input paths of its identity.",
                    },
                    "probes": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {
                                "tool": {"type": "string", "minLength": 1},
                                "input": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string", "minLength": 1},
                                },
                                "landed": {"type": "string", "minLength": 1},
                                "output": {"type": "string", "minLength": 1},
                            },
                            "required": ["tool", "input", "landed"],
                            "additionalProperties": False,
                        },
                        "description": (
                            "Write tool name -> the read of this server (declared `read`) that "
                            "tells whether a call of it landed: `input` maps the read's fields "
                            "to dotted paths into the write's input, `landed` is the dotted path "
                            "of a boolean in its answer, `output` the part of the answer the "
                            "write records (default: all of it). Built-in agents only."
                        ),
                    },
                    "timeout": _seconds(MAX_MCP_TIMEOUT, "1 day"),
                    "port": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 65535,
                        "description": (
                            "A process agent's `url` server only: "
                            "the fixed loopback port of its stand-in."
                        ),
                    },
                },
            ),
            oneOf=[{"required": ["command"]}, {"required": ["url"]}],
            # Two names for one table: a server gives one of them.
            **{"not": {"required": ["effects", "effect_overrides"]}},
        ),
    },
}
