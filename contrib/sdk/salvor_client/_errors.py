"""The one error the client raises for a refusal."""

from __future__ import annotations


class SalvorError(Exception):
    """The daemon refused a call: ``status``, ``code`` and ``details`` are its error envelope's."""

    def __init__(self, status: int, code: str, message: str, details: dict | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details or {}
