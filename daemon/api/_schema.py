"""JSON Schema building blocks the request bodies, the answers and the OpenAPI document share.

They are the pure core's (``salvor.protocol``), whose own wire shapes are built from the same
pieces; named here once for the API's modules.
"""

from __future__ import annotations

from salvor.protocol import ANY, HASH_PATTERN, INSTANT, JSON, SEQ, closed, exactly, nullable, ref

__all__ = ["ANY", "HASH_PATTERN", "INSTANT", "JSON", "SEQ", "closed", "exactly", "nullable", "ref"]
