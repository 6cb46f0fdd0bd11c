"""Errors the store raises, each one sentence a person can act on.

Every error carries the control-plane ``code`` it maps to (its HTTP status is
that code's in ``salvor.protocol.ErrorCode``), like the pure core's errors, so
the API layer reports it without a second mapping. ``StoreError`` itself is
never raised: raise the subclass that names what went wrong.
"""

from __future__ import annotations

from salvor.protocol import CodedError, ErrorCode, abstract_error


@abstract_error
class StoreError(CodedError):
    """Base of every store error; raise a subclass, never this class."""


class StoreUnavailable(StoreError):
    """The store cannot be opened or reached (bad URL, unreachable server, unwritable path).

    ``transient`` says whether the failure may pass by itself with nothing
    changed by salvor (a full disk, a lock held too long, a lost connection,
    a read-only file): what failed may then be tried again later. A failure
    that will not pass (a bad URL, a value the database refuses, a corrupt
    file) is not transient.
    """

    code = ErrorCode.STORE_UNAVAILABLE

    def __init__(
        self, message: str, *, transient: bool = False, details: dict | None = None
    ) -> None:
        super().__init__(message, details=details)
        self.transient = transient


class StoreTooNew(StoreError):
    """The store was written by a newer salvor whose schema this build does not know."""

    code = ErrorCode.STORE_TOO_NEW


class SeqConflict(StoreError):
    """Another writer already appended at that seq; nothing of the batch was written."""

    code = ErrorCode.DIVERGENCE


class ClaimHeld(StoreError):
    """An idempotency identity is already claimed; nothing of the batch was written."""

    code = ErrorCode.CLAIM_HELD

    def __init__(self, message: str, *, identity: str, run_id: str, seq: int, state: str) -> None:
        super().__init__(message)
        self.identity = identity
        self.run_id = run_id
        self.seq = seq
        self.state = state


class Fenced(StoreError):
    """A driver's fence is stale: another node (or a later claim) owns the run now, or the
    node's own lease has lapsed. Nothing of the refused append (or claim) was written.

    ``owner_node`` and ``owner_epoch`` are the run's owner as the store holds it (None and 0
    when it has none, or when the refusal is about the node's lease rather than a run).
    """

    code = ErrorCode.WRONG_STATE

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None,
        epoch: int,
        owner_node: str | None = None,
        owner_epoch: int = 0,
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.epoch = epoch
        self.owner_node = owner_node
        self.owner_epoch = owner_epoch


class CorruptLog(StoreError):
    """A stored envelope cannot be decoded; the error names its run and seq."""

    code = ErrorCode.INTERNAL

    def __init__(self, message: str, *, run_id: str, seq: int) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.seq = seq


class BadCursor(StoreError):
    """A listing cursor this store did not issue."""

    code = ErrorCode.BAD_REQUEST


class StoreOwned(StoreError):
    """Another live salvor process holds the store (or the run) in a way
    this command may not share."""

    code = ErrorCode.STORE_OWNED


# PEP 249 names the classes of database failure alike in every driver (and
# SQLAlchemy wraps them under the same names): an operational failure or a
# lost interface is the database's situation, not the statement's fault.
_TRANSIENT_CLASSES = frozenset({"OperationalError", "InterfaceError"})
# SQLite calls a missing table "operational" too, so there its primary result
# code decides: busy, locked, out of memory, read-only, I/O error, full,
# cannot open, locking protocol.
_SQLITE_TRANSIENT_CODES = frozenset({5, 6, 7, 8, 10, 13, 14, 15})


def passes_by_itself(exc: BaseException) -> bool:
    """Whether a database failure may pass with nothing changed by salvor.

    True for SQLite's full disk, busy lock, read-only or unopenable file and
    I/O error, and for PostgreSQL's operational failures (a lost connection,
    a shutdown, a full disk, a cancelled statement, a serialisation
    failure); False for a constraint, a value the database cannot keep, a
    missing table or a malformed file.
    """
    inner = getattr(exc, "orig", None) or exc
    code = getattr(inner, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _SQLITE_TRANSIENT_CODES
    return any(cls.__name__ in _TRANSIENT_CLASSES for cls in type(inner).__mro__)


def store_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a store failure that may pass by itself
    (``StoreUnavailable`` marked transient)."""
    return isinstance(exc, StoreUnavailable) and exc.transient


class QuotaExceeded(StoreError):
    """An append would take a run past its event or byte quota; nothing of it was written.

    ``details`` names the limit (``limit``: ``max_run_events`` or ``max_run_bytes``), its
    value, and what the run held.
    """

    code = ErrorCode.QUOTA_EXCEEDED


class PayloadTooLarge(StoreError):
    """One event's payload is over the per-payload limit; nothing of its append was written."""

    code = ErrorCode.PAYLOAD_TOO_LARGE
