"""Notifications to the operator: the store's outbox delivered to a webhook or a command.

Rule: delivery never sits on a run's path. The store writes an outbox row in the
same transaction as the event that calls for it; this room reads due rows,
delivers them at least once with backoff, and marks them delivered. Where it
delivers comes from the command line only, never from an HTTP caller. Imports
only the packages below it.
"""

from __future__ import annotations

from ._deliverer import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_CAP_SECONDS,
    Deliverer,
    retry_delay,
)
from ._targets import (
    SIGNATURE_HEADER,
    NotifyConfig,
    signature,
    webhook_url_problem,
)

__all__ = [
    "BACKOFF_BASE_SECONDS",
    "BACKOFF_CAP_SECONDS",
    "SIGNATURE_HEADER",
    "Deliverer",
    "NotifyConfig",
    "retry_delay",
    "signature",
    "webhook_url_problem",
]
