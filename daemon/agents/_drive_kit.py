"""What every drive of a run is handed and no run changes: the kit a driver carries.

A drive takes a run from its log to its next resting point (``drive``, and a graph run's walk).
Everything it needs besides the run and its definition is the same for every run one daemon (or
one command line) drives: the store, the tool registry, the clock, the loopback proxy, the
operator's credentials, the flow tools' host. They travel together, frozen, so a layer that
passes a drive on (a graph walk driving its map items, the flow host driving a subagent) hands
on the one bundle and cannot drop or change a part of it on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from ..flows import FlowHost
from ..mcp import McpServerSpec
from ..models import ModelClients
from ..processes import PortClaims
from ..proxies import ModelProxy
from ..recording import StoreAccess, utc_now
from ..tools import ToolRegistry
from ._credentials import Credentials


@dataclass(frozen=True, slots=True, kw_only=True)
class DriveKit:
    """What a drive needs besides its run: fixed for the life of whoever drives.

    Attributes:
        access: the store, through its writer and reader threads, and the driving set.
        registry: the native tools a built-in agent may name.
        clock: every clock reading of a drive (and each is recorded).
        credentials: which key goes to which model endpoint (``gateway_for``).
        proxy: the loopback model proxy process and service agents are driven through; None
            starts one per drive (the command line).
        process_restarts: how often one drive starts a process agent again after a signal
            killed it.
        ports: which run holds each service agent's loopback port.
        flows: the host behind the flow tools a built-in agent opted into (None: only those
            that need no host, ``ask_user`` and ``finish``).
        model_clients: the HTTP clients built-in agents' model calls go out on, kept between
            drives (None: each drive's gateway makes its own).
        attachable_mcp: the MCP servers the operator lets be attached to a run by name
            (``--attachable-mcp``), by name: what an attachment recorded as ``mcp:<name>``
            reaches.
    """

    access: StoreAccess
    registry: ToolRegistry
    clock: Callable[[], datetime] = utc_now
    credentials: Credentials = field(default_factory=Credentials)
    proxy: ModelProxy | None = None
    process_restarts: int = 0
    ports: PortClaims = field(default_factory=PortClaims)
    flows: FlowHost | None = None
    model_clients: ModelClients | None = None
    attachable_mcp: Mapping[str, McpServerSpec] = field(default_factory=dict)
