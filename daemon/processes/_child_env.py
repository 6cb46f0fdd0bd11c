"""The environment salvor gives a process it starts: an allow-list of the daemon's, never
the daemon's minus a few names.

Agents and stdio MCP servers run code the operator did not write line by
line, so they get what a program needs to run and nothing else: whatever
secret the daemon holds (its upstream key, the variable ``--auth-token``
names, a provider key under any name, a database URL) stays in the daemon.
What salvor injects (base URLs, the placeholder key, the task, the MCP
stand-ins, the orphan mark) and the definition's own ``env`` are added on
top by the callers, the definition's last.
"""

from __future__ import annotations

from collections.abc import Mapping

# Passed through from the daemon's environment, each because a program
# needs it to run as it would in the operator's shell:
PASSED_THROUGH = frozenset(
    {
        "PATH",  # finding the command and what it starts (python, node, npx)
        "HOME",  # per-user config and caches (npm, pip, the SDKs' own files)
        "USER",
        "LOGNAME",  # libraries that ask who they run as
        "SHELL",  # tools that start a shell for a subcommand
        "LANG",
        "LANGUAGE",
        "TZ",  # text encoding, messages and local time as the operator set them
        "TMPDIR",  # where temporary files go
        "TERM",  # programs that colour or size their output
    }
)
# And every LC_* (the locale's categories), for the same reason as LANG.
PASSED_THROUGH_PREFIXES = ("LC_",)
# Left out on purpose: HTTP(S)_PROXY and NO_PROXY (a proxy URL can carry a
# password, and an agent's model traffic goes to the loopback proxy anyway),
# PYTHONPATH/NODE_PATH and the like (they change what code runs), XDG_RUNTIME_DIR
# and DBUS_SESSION_BUS_ADDRESS (the user's session services). A definition
# that needs one sets it in its own `env`.

# SDK telemetry that posts to a fixed public host: an agent's traffic goes
# to salvor or nowhere. openai-agents' tracer sends every trace to
# api.openai.com with whatever key the process holds (salvor's placeholder)
# and holds the process's exit for seconds flushing it. The openai and
# anthropic SDKs themselves send nothing of the kind. A definition's `env`
# may switch it back on.
TELEMETRY_OFF = {"OPENAI_AGENTS_DISABLE_TRACING": "1"}


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of ``environ``, with SDK telemetry switched off."""
    env = {
        k: v
        for k, v in environ.items()
        if k in PASSED_THROUGH or k.startswith(PASSED_THROUGH_PREFIXES)
    }
    env.update(TELEMETRY_OFF)
    return env
