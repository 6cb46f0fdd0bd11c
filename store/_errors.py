"""Errors the store raises, each one sentence a person can act on.

Every error carries the control-plane ``code`` and HTTP ``status`` it maps to,
like the pure core's errors, so the API layer reports it without a second
mapping. ``StoreError`` itself is never raised: raise the subclass that names
what went wrong.
"""

from __future__ import annotations

from salvor.protocol import CodedError, abstract_error


@abstract_error
class StoreError(CodedError):
    """Base of every store error; raise a subclass, never this class."""


class StoreUnavailable(StoreError):
    """The store cannot be opened or reached (bad URL, unreachable server, unwritable path)."""

    code = "store_unavailable"
    status = 503


class StoreTooNew(StoreError):
    """The store was written by a newer salvor whose schema this build does not know."""

    code = "store_too_new"
    status = 503


class SeqConflict(StoreError):
    """Another writer already appended at that seq; nothing of the batch was written."""

    code = "divergence"
    status = 409


class ClaimHeld(StoreError):
    """An idempotency identity is already claimed; nothing of the batch was written."""

    code = "claim_held"
    status = 409

    def __init__(self, message: str, *, identity: str, run_id: str, seq: int, state: str) -> None:
        super().__init__(message)
        self.identity = identity
        self.run_id = run_id
        self.seq = seq
        self.state = state


class CorruptLog(StoreError):
    """A stored envelope cannot be decoded; the error names its run and seq."""

    code = "internal"
    status = 500

    def __init__(self, message: str, *, run_id: str, seq: int) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.seq = seq


class BadCursor(StoreError):
    """A listing cursor this store did not issue."""

    code = "bad_request"
    status = 400


class StoreOwned(StoreError):
    """Another live salvor process holds the store (or the run) in a way this command may not share."""

    code = "store_owned"
    status = 409
