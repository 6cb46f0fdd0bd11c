"""Agent kinds: definitions and their hashes, operator credentials, the built-in loop, process
agents and service agents.

Rule: imports only the packages below it; knows nothing of HTTP routes or client-driven runs.
"""

from __future__ import annotations

from ._credentials import (
    CredentialError,
    Credentials,
    LlmChoice,
)
from ._definition import (
    DEFAULT_PROVIDER,
    HTTP_FIELDS,
    PROVIDERS,
    AgentDefinition,
    AgentKind,
    DefinitionError,
    load_definition,
    parse_definition,
)
from ._loop import (
    FINISH_REMINDER,
    FINISH_REMINDERS,
    AgentLoop,
    declared_outputs,
    declares_probe,
    drive,
    flow_session,
    gateway_for,
    offered_besides_mcp,
    probes_open_write,
)
from ._process import (
    agent_environment,
    supervise,
)

__all__ = [
    "DEFAULT_PROVIDER",
    "FINISH_REMINDER",
    "FINISH_REMINDERS",
    "HTTP_FIELDS",
    "PROVIDERS",
    "AgentDefinition",
    "AgentKind",
    "AgentLoop",
    "CredentialError",
    "Credentials",
    "DefinitionError",
    "LlmChoice",
    "agent_environment",
    "declared_outputs",
    "declares_probe",
    "drive",
    "flow_session",
    "gateway_for",
    "load_definition",
    "offered_besides_mcp",
    "parse_definition",
    "probes_open_write",
    "supervise",
]
