"""Notifications to the operator: the store's outbox delivered to a webhook or a command.

Rule: delivery never sits on a run's path. The store writes an outbox row in the
same transaction as the event that calls for it; this room reads due rows,
delivers them at least once with backoff, and marks them delivered. Where it
delivers comes from the command line only, never from an HTTP caller.
"""

__all__: list[str] = []
