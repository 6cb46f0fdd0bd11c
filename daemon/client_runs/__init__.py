"""Client-driven runs: the service the client-run routes call (``ClientRuns``), and behind it the
generic append, server-performed model and tool steps, client-performed calls, client tool
declarations, drive leases, and the answers of their routes.

Rule: imports only the packages below it; never the agent loop. Callers above reach the store
through ``ClientRuns``, never through the step functions behind it.
"""

from __future__ import annotations

from ._answers import (
    CLIENT_RUN_ANSWERS,
)
from ._client_runs import (
    ClientRuns,
    OpenedRun,
)
from ._client_tools import (
    ClientTool,
    check_resolution,
    load_declarations,
)
from ._leases import (
    DEFAULT_TTL_SECONDS,
    DriveLeases,
    LeaseRegistry,
    lease_ttl,
)
from ._steps import (
    MODEL_REQUEST_FIELDS,
    ModelCall,
    open_model_executor,
    registry_unavailable,
)
from ._stored_leases import (
    StoredLeases,
)

__all__ = [
    "CLIENT_RUN_ANSWERS",
    "DEFAULT_TTL_SECONDS",
    "MODEL_REQUEST_FIELDS",
    "ClientRuns",
    "ClientTool",
    "DriveLeases",
    "LeaseRegistry",
    "ModelCall",
    "OpenedRun",
    "StoredLeases",
    "check_resolution",
    "lease_ttl",
    "load_declarations",
    "open_model_executor",
    "registry_unavailable",
]
