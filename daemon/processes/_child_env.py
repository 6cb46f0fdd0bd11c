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

# SDK telemetry and tracing that posts to a fixed public host, switched off: an
# agent's traffic goes to salvor or nowhere. Each switch is the one its
# package reads (checked against its source); a package that is not installed
# ignores its own. A definition's `env` is applied after these, so an operator
# may switch any of them back on. The openai and anthropic SDKs, smolagents and
# the `llm` CLI send nothing of the kind.
TELEMETRY_OFF = {
    # openai-agents: its tracer sends every trace to api.openai.com with whatever
    # key the process holds (salvor's placeholder), and holds the exit for seconds
    # flushing them.
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    # LangSmith (and LangChain through it): tracing to smith.langchain.com; it reads
    # both prefixes, with and without _V2, and only the exact "true" turns it on.
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    "LANGCHAIN_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    # agno: posts each run's model and events to its own API, on by default.
    "AGNO_TELEMETRY": "false",
    # CrewAI: anonymous OpenTelemetry spans to its collector, on by default (it
    # stops for any of the three below), and its opt-in trace upload and
    # first-run prompt.
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    # The OpenTelemetry SDK (CrewAI's telemetry rides on it, and so does any
    # instrumentation a framework sets up by itself).
    "OTEL_SDK_DISABLED": "true",
    # litellm: fetches its model price map from GitHub when imported; its bundled
    # copy serves instead. (Its callbacks are set in code, never from the environment.)
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    # huggingface_hub (smolagents depends on it): usage pings to the Hub.
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # The shared convention (huggingface_hub, and CLI tools that honour it).
    "DO_NOT_TRACK": "1",
    # Chroma (a vector store many agent frameworks embed): PostHog usage events.
    "ANONYMIZED_TELEMETRY": "False",
    # mem0 (agent memory): PostHog usage events, on by default.
    "MEM0_TELEMETRY": "False",
    # Haystack: PostHog usage events, on by default.
    "HAYSTACK_TELEMETRY_ENABLED": "False",
}


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of ``environ``, with SDK telemetry switched off (``TELEMETRY_OFF``)."""
    env = {
        k: v
        for k, v in environ.items()
        if k in PASSED_THROUGH or k.startswith(PASSED_THROUGH_PREFIXES)
    }
    env.update(TELEMETRY_OFF)
    return env
