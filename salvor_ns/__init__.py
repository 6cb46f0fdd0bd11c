"""salvor: durable execution for AI agent runs.

The distribution maps three top-level source folders into this namespace:
``protocol/`` (pure), ``store/`` (SQL) and ``daemon/`` (trio).
"""

__version__ = "0.2.0"
