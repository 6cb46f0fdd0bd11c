"""The command line's two refusals, each one sentence on stderr with nothing recorded, and its
exit statuses (``_main``'s docstring says when each is given)."""

from __future__ import annotations

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_RUN_FAILED = 0, 1, 2, 3


class CliError(Exception):
    """A command-line mistake, reported as one sentence."""


class UsageError(CliError):
    """A flag the command cannot start with, reported as one sentence; exit status 2."""
