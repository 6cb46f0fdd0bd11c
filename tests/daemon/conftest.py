"""Fixtures for every daemon test: an in-process Runtime over a test store
(``tests/support/runtime.py``) and a whole daemon over loopback HTTP
(``tests/support/api_server.py``).

``providers`` is the daemon's: each scripted provider it starts is also declared as an operator
model endpoint, which a Runtime-level test simply never asks about.
"""

from tests.support.api_server import operator_declarations, providers, server, server_factory
from tests.support.runtime import (
    clock,
    effects_path,
    fx,
    make_agent,
    registry,
    runtime,
    upstream_env,
)

__all__ = [
    "clock",
    "effects_path",
    "fx",
    "make_agent",
    "operator_declarations",
    "providers",
    "registry",
    "runtime",
    "server",
    "server_factory",
    "upstream_env",
]
