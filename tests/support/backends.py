"""Which store backends a test runs on.

The store's own behaviour (appends, claims, locks, upgrades, faults) is tested on every backend:
``tests/store``, the kill tests, the racing tests and the daemon's store-bound paths keep
``BOTH``. A module whose subject sits above the store (a model wire format, an MCP stand-in, an
SDK agent, a definition's refusal) says ``STORE_BACKENDS = SQLITE_ONLY``: it reaches the store
through the same ``StoreAccess`` calls on either backend, so running it twice tests the store
again, not the module. A test in such a module that does depend on the backend parametrizes
``store_url`` itself (``indirect=True``), which wins over the module's choice.
"""

from __future__ import annotations

BOTH = ("sqlite", "postgres")
SQLITE_ONLY = ("sqlite",)


def backends_of(module: object) -> tuple[str, ...]:
    """The backends a module's ``store_url`` tests run on: its ``STORE_BACKENDS``, else both."""
    return tuple(getattr(module, "STORE_BACKENDS", BOTH))
