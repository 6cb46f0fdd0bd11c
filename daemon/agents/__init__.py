"""Agent kinds: definitions (TOML, JSON, markdown) and their hashes, operator credentials, the
built-in loop, process agents and service agents.

Rule: imports only the packages below it; knows nothing of HTTP routes or client-driven runs.
"""

from __future__ import annotations

from ._agent_definition import (
    AgentDefinition,
    AgentKind,
)
from ._attachable_servers import (
    AttachableError,
    load_attachable_servers,
)
from ._attachments import (
    attached_declares_probe,
    attachments_before,
    withdrawal_refusal,
    withdrawn_servers,
)
from ._credentials import (
    CredentialError,
    Credentials,
    DeclaredOrigin,
    LlmChoice,
)
from ._definition import (
    HTTP_FIELDS,
    load_definition,
    parse_definition,
)
from ._definition_error import DefinitionError
from ._definition_rules import (
    MAX_DESCRIPTION_CHARS,
    MAX_LLM_TIMEOUT,
    MAX_PROCESS_TIMEOUT,
    MAX_WALL_TIME_BUDGET,
)
from ._definition_text import (
    FORMATS,
    MAX_DEFINITION_BYTES,
    format_of,
)
from ._diagnostics import (
    agent_diagnostics,
    graph_diagnostics,
    graph_error_diagnostics,
)
from ._drive import (
    declares_probe,
    drive,
    fail_unreachable,
    flow_session,
    gateway_for,
    probes_open_write,
    reach_refusal,
)
from ._drive_kit import (
    DriveKit,
)
from ._llm_table import (
    DEFAULT_PROVIDER,
    PROVIDERS,
)
from ._loop import (
    FINISH_REMINDER,
    FINISH_REMINDERS,
    AgentLoop,
    offered_besides_mcp,
)
from ._markdown import read_markdown
from ._outside_definition import OUTPUT_SOURCES
from ._process import (
    parked_write,
    supervise,
)
from ._process_attachments import lane_called
from ._process_environment import (
    agent_command,
    agent_environment,
    standin_relays,
)

__all__ = [
    "DEFAULT_PROVIDER",
    "FINISH_REMINDER",
    "FINISH_REMINDERS",
    "FORMATS",
    "HTTP_FIELDS",
    "MAX_DEFINITION_BYTES",
    "MAX_DESCRIPTION_CHARS",
    "MAX_LLM_TIMEOUT",
    "MAX_PROCESS_TIMEOUT",
    "MAX_WALL_TIME_BUDGET",
    "OUTPUT_SOURCES",
    "PROVIDERS",
    "AgentDefinition",
    "AgentKind",
    "AgentLoop",
    "AttachableError",
    "CredentialError",
    "Credentials",
    "DeclaredOrigin",
    "DefinitionError",
    "DriveKit",
    "LlmChoice",
    "agent_command",
    "agent_diagnostics",
    "agent_environment",
    "attached_declares_probe",
    "attachments_before",
    "declares_probe",
    "drive",
    "fail_unreachable",
    "flow_session",
    "format_of",
    "gateway_for",
    "graph_diagnostics",
    "graph_error_diagnostics",
    "lane_called",
    "load_attachable_servers",
    "load_definition",
    "offered_besides_mcp",
    "parked_write",
    "parse_definition",
    "probes_open_write",
    "reach_refusal",
    "read_markdown",
    "standin_relays",
    "supervise",
    "withdrawal_refusal",
    "withdrawn_servers",
]
