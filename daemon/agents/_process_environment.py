"""What a process agent starts with: its argv, its environment and its MCP stand-ins' relays.

The task reaches the program in ``SALVOR_PROMPT``/``SALVOR_INPUT`` and, where ``command`` has a
``{prompt}`` element, as one argument (never through a shell). The environment is the daemon's
allow-list, the model base URLs of this run's capability path on the proxy with placeholder keys,
and the definition's ``env``; each MCP server the run reaches is named by a stand-in whose
endpoint is written to a relay file only the daemon's user reads, never put on a command line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..mcp import McpServerSpec
from ..processes import child_environment
from ..proxies import SALVOR_SERVER, variable_suffix
from ._agent_definition import AgentDefinition
from ._outside_definition import PROMPT_PLACEHOLDER

PLACEHOLDER_KEY = "salvor-placeholder"


def task_prompt(run_input: Any) -> str:
    """The task as an agent reads it: the run input when it is a string, else its JSON."""
    return run_input if isinstance(run_input, str) else json.dumps(run_input, ensure_ascii=False)


def agent_command(agent: AgentDefinition, run_input: Any) -> tuple[str, ...]:
    """The argv a run of ``agent`` starts: its ``command`` with each ``{prompt}`` element
    replaced by the task (``task_prompt``), which stays one argument whatever it holds.

    The task is data, not a secret, but an argument is readable by every local user
    (``/proc/<pid>/cmdline``); ``SALVOR_PROMPT`` carries it without that.
    """
    prompt = task_prompt(run_input)
    return tuple(prompt if arg == PROMPT_PLACEHOLDER else arg for arg in agent.process.command)


def checked_task(run_input: Any) -> str | None:
    """The text a model request must carry for a run's task to count as having reached the
    model: a text input, stripped; None (nothing checked) for a structured input, which an
    agent may well present to its model in its own words, or a blank one."""
    if not isinstance(run_input, str) or not run_input.strip():
        return None
    return run_input.strip()


def standin_servers(agent: AgentDefinition) -> tuple[McpServerSpec, ...]:
    """The servers a run of ``agent`` reaches through stand-ins: its own, then ``salvor``."""
    if not agent.salvor_mcp:
        return agent.mcp_servers
    return (*agent.mcp_servers, McpServerSpec(name=SALVOR_SERVER))


def write_relays(agent: AgentDefinition, base: str) -> tuple[str, dict[str, str]]:
    """A private directory (0700) with one relay file (0600) per stand-in of a run of
    ``agent``, each holding its endpoint's URL; the directory and each server's file.

    The URL is a capability of the run (``base``): it goes where only the daemon's user reads
    it, never on a command line. Blocking: call it off the trio thread.
    """
    directory = tempfile.mkdtemp(prefix="salvor-relay-")
    files = {}
    for spec in standin_servers(agent):
        path = os.path.join(directory, variable_suffix(spec.name))
        held = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(held, "w", encoding="utf-8") as out:
            out.write(f"{base}/mcp/{spec.name}\n")
        files[spec.name] = path
    return directory, files


@asynccontextmanager
async def standin_relays(agent: AgentDefinition, base: str) -> AsyncIterator[dict[str, str]]:
    """The relay files of one drive's stand-ins (``write_relays``), removed when it ends."""
    directory, files = await trio.to_thread.run_sync(write_relays, agent, base)
    try:
        yield files
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(shutil.rmtree, directory, True)


def standin_environment(
    agent: AgentDefinition, base: str, relays: Mapping[str, str]
) -> dict[str, str]:
    """One pair of variables per MCP server the run reaches, each naming that server's stand-in.

    ``SALVOR_MCP_SERVER_<NAME>``: a shell-quoted command line the agent's MCP
    configuration spawns in place of the server (the stdio relay, given the
    file in ``relays`` that holds its endpoint: MCP clients spawn servers with a
    scrubbed environment, and a command line is no place for a capability);
    ``SALVOR_MCP_URL_<NAME>``: the streamable-HTTP endpoint it may dial
    instead. Both reach the same lane, whatever the real server speaks (the
    ``salvor`` server's answers in this process). A server with no relay file
    gets no ``SALVOR_MCP_SERVER_<NAME>``.
    """
    env = {}
    for spec in standin_servers(agent):
        url = f"{base}/mcp/{spec.name}"
        suffix = variable_suffix(spec.name)
        if spec.name in relays:
            env[f"SALVOR_MCP_SERVER_{suffix}"] = shlex.join(
                [sys.executable, "-m", "salvor.daemon.standin", relays[spec.name]]
            )
        env[f"SALVOR_MCP_URL_{suffix}"] = (
            url if spec.port is None else f"http://127.0.0.1:{spec.port}/mcp"
        )
    return env


def agent_environment(
    agent: AgentDefinition,
    run_id: str,
    run_input: Any,
    base: str,
    environ: Mapping[str, str] = os.environ,
    relays: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The process's environment: the allow-list of the daemon's (``_child_env``), the
    injection, the definition's ``env``. ``relays``: each stand-in's relay file
    (``standin_relays``)."""
    env = child_environment(environ)
    prompt = task_prompt(run_input)
    env.update(
        {
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_BASE": f"{base}/v1",
            "OPENAI_BASE": f"{base}/v1",
            "ANTHROPIC_BASE_URL": base,
            "SALVOR_LLM_PROXY": f"{base}/v1",
            "OPENAI_API_KEY": PLACEHOLDER_KEY,
            "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
            "SALVOR_PROMPT": prompt,
            "SALVOR_INPUT": json.dumps(run_input, ensure_ascii=False),
            "SALVOR_RUN_ID": run_id,
        }
    )
    env.update(standin_environment(agent, base, relays or {}))
    env.update(agent.process.env)
    return env
