"""Errors raised by the pure core, split by who is at fault.

Every error carries the control-plane ``code`` and HTTP ``status`` it maps to,
so the API layer and the CLI report it without inventing a second mapping.
A ``ProtocolError`` is never raised directly: raise the subclass that names
the fault.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every pure-core error; raise a subclass, never this class."""

    code: str = "internal"
    status: int = 500

    def __init__(self, message: str, *, details: dict | None = None) -> None:
        if type(self) is ProtocolError:
            raise TypeError("raise a subclass of ProtocolError, not ProtocolError itself")
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict:
        """The one error envelope: ``{"error": {"code", "message", "details"?}}``."""
        body: dict = {"code": self.code, "message": self.message}
        if self.details is not None:
            body["details"] = self.details
        return {"error": body}


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
