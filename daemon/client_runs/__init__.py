"""Client-driven runs: the generic append, server-performed model and tool steps, client-performed
calls, client tool declarations, drive leases, and the answers of their routes.

Rule: imports only the packages below it; never the agent loop.
"""

from __future__ import annotations

from ._answers import (
    CLIENT_RUN_ANSWERS,
)
from ._appends import (
    ClientAppends,
)
from ._client_tools import (
    ClientTool,
    check_resolution,
    load_declarations,
)
from ._leases import (
    DEFAULT_TTL_SECONDS,
    LeaseRegistry,
    lease_ttl,
)
from ._performed import (
    declared,
    model_completion,
    model_intent,
    tool_completion,
    tool_intent,
)
from ._steps import (
    MODEL_REQUEST_FIELDS,
    ModelCall,
    open_model_executor,
    open_model_step,
    perform_model_step,
    tool_step,
)

__all__ = [
    "CLIENT_RUN_ANSWERS",
    "DEFAULT_TTL_SECONDS",
    "MODEL_REQUEST_FIELDS",
    "ClientAppends",
    "ClientTool",
    "LeaseRegistry",
    "ModelCall",
    "check_resolution",
    "declared",
    "lease_ttl",
    "load_declarations",
    "model_completion",
    "model_intent",
    "open_model_executor",
    "open_model_step",
    "perform_model_step",
    "tool_completion",
    "tool_intent",
    "tool_step",
]
