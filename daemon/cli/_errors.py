"""The command line's two refusals: each one sentence on stderr, nothing recorded."""

from __future__ import annotations


class CliError(Exception):
    """A command-line mistake, reported as one sentence."""


class UsageError(CliError):
    """A flag the command cannot start with, reported as one sentence; exit status 2."""
