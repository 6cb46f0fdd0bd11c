"""Errors raised by the pure core, split by who is at fault.

Every salvor error carries the control-plane ``code`` and HTTP ``status`` it
maps to (``CodedError``), so the API layer and the CLI report any of them
the same way, without a second mapping. A base class is never raised
directly: raise the subclass that names the fault.
"""

from __future__ import annotations

# How much of a caller's text a message may quote: enough to recognise it, never a whole body.
EXCERPT_CHARS = 64


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """At most ``limit`` characters of ``text`` for an error message, with "…" when it was cut."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "…"


class CodedError(Exception):
    """Base of every salvor error: one sentence, a stable code, an HTTP status.

    The store's and the daemon's errors derive from it too, so the one error
    envelope is rendered in one place.
    """

    code: str = "internal"
    status: int = 500

    def __init__(self, message: str, *, details: dict | None = None) -> None:
        if type(self) in _ABSTRACT:
            raise TypeError(f"raise a subclass of {type(self).__name__}, not the class itself")
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict:
        """The one error envelope: ``{"error": {"code", "message", "details"?}}``."""
        body: dict = {"code": self.code, "message": self.message}
        if self.details is not None:
            body["details"] = self.details
        return {"error": body}


class ProtocolError(CodedError):
    """Base of every pure-core error; raise a subclass, never this class."""


_ABSTRACT: set[type] = {CodedError, ProtocolError}


def abstract_error(cls: type) -> type:
    """Mark an error base class that must never be raised itself."""
    _ABSTRACT.add(cls)
    return cls


class MalformedEvent(ProtocolError):
    """Bytes or fields that do not form a well-typed event or envelope (the sender's fault)."""

    code = "bad_request"
    status = 400


class GuardRefusal(ProtocolError):
    """An event that is well formed but is not the one legal next event of its run."""

    code = "divergence"
    status = 409


class SchemaViolation(ProtocolError):
    """A value a recorded JSON schema (or the budget-extension shape) rejects."""

    code = "bad_request"
    status = 400

    def __init__(self, message: str, *, violations: list[dict] | None = None) -> None:
        super().__init__(message)
        self.violations = violations or []


class ReplayDivergence(ProtocolError):
    """A re-run asked for a call the recorded log does not hold at that position."""

    code = "divergence"
    status = 409
