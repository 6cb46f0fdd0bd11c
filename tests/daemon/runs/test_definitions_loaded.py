"""Loading a stored agent definition: built once per daemon, then kept, by its hash."""

from __future__ import annotations

import pytest
from salvor.daemon.runs import _definitions
from salvor.daemon.web import OperationRefused


async def test_a_loaded_definition_is_built_once_and_kept(
    runtime, providers, make_agent, monkeypatch
):
    agents = [make_agent(providers([]), extra=f'name = "agent-{n}"') for n in range(3)]
    for agent in agents:
        await runtime.definitions.register_agent(agent)
    definitions = runtime.definitions
    first = await definitions.load_agent(agents[0].agent_def_hash)
    assert first == agents[0]
    # The second start or drive of the agent neither reads the store nor parses again.
    assert await definitions.load_agent(agents[0].agent_def_hash) is first
    # Bounded: past KEPT_AGENTS, the least recently loaded one is built again when next named.
    monkeypatch.setattr(_definitions, "KEPT_AGENTS", 2)
    second = await definitions.load_agent(agents[1].agent_def_hash)
    await definitions.load_agent(agents[0].agent_def_hash)
    await definitions.load_agent(agents[2].agent_def_hash)
    assert await definitions.load_agent(agents[0].agent_def_hash) is first
    rebuilt = await definitions.load_agent(agents[1].agent_def_hash)
    assert rebuilt == second and rebuilt is not second


async def test_an_unknown_hash_is_refused_each_time(runtime):
    for _ in range(2):
        with pytest.raises(OperationRefused, match="sha256:unknown"):
            await runtime.definitions.load_agent("sha256:unknown")
