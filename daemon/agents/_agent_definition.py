"""What a validated agent definition is: its kind, its settings for that kind, and its identity.

Values only: the parsers that build them and the rules they are held to live beside this module
(``_definition`` and the modules it names), so the loop, the process supervisor and the service
driver read a definition without importing a parser.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from salvor.protocol import DeclaredInput, DeclaredOutput, FlowTool

from ..files import FileAccess
from ..mcp import McpServerSpec

DEFAULT_PROCESS_TIMEOUT = 300.0


class AgentKind(enum.StrEnum):
    """What drives an agent's run: salvor's own loop, a local process, or a running service."""

    BUILTIN = "builtin"
    PROCESS = "process"
    SERVICE = "service"


# The kinds a definition names with ``kind``; absent, it is a built-in agent.
KINDS = (AgentKind.PROCESS, AgentKind.SERVICE)


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
    # Registry tools and file tools alike, by name (a file tool is built per drive: ``files``).
    tools: tuple[str, ...] = ()
    # Where the file tools may read and write (None: the default, read everything, write nothing).
    access: FileAccess | None = None
    # The skills the agent declares, by name (resolved when a run starts: ``_skill_calls``).
    skills: tuple[str, ...] = ()
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
