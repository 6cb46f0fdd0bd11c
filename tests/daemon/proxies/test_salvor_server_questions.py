"""``ask_user``'s question types on both agent kinds: a built-in agent asking natively and a process
agent asking through the ``salvor`` MCP server with the real ``mcp`` SDK client park their run on
the same answer shape (a confirm's boolean, a multi-select's list of options, a select allowing a
custom answer, an input's default), a resume outside it is refused with nothing recorded, and the
fitting answer is what the agent's model reads, in its JSON type.
"""

from __future__ import annotations

import json

import pytest
from salvor.daemon.agents import parse_definition
from salvor.daemon.web import OperationRefused
from salvor.protocol import question_schema

from tests.daemon.proxies.test_salvor_server import salvor_agent, steps_script, tool_results
from tests.support.backends import SQLITE_ONLY
from tests.support.runtime import agent_toml

# The lane is the salvor server's, tested on SQLite (tests/support/backends.py).
STORE_BACKENDS = SQLITE_ONLY

COLOURS = ["red", "blue", "green"]
CASES = [
    ({"question": "Paint it?", "type": "confirm"}, True, "yes"),
    (
        {"question": "Which colours?", "type": "select", "options": COLOURS, "multiSelect": True},
        ["red", "green"],
        "red",
    ),
    (
        {"question": "Which colour?", "type": "select", "options": COLOURS, "allowCustom": True},
        "teal, like the sea",
        ["teal"],
    ),
    ({"question": "Its title?", "type": "input", "defaultValue": "Untitled"}, "Tides", 7),
]


async def _asked(runtime, provider, agent, question, good, bad) -> None:
    run_id = await runtime.starts.start_run(agent, "ask first")
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {
        "state": "suspended",
        "reason": question["question"],
        "input_schema": question_schema(question),
    }, view.detail
    before = view.event_count
    with pytest.raises(OperationRefused) as refused:
        await runtime.control.resume(run_id, {"answer": bad})
    assert refused.value.code == "bad_request"
    assert (await runtime.reads.view(run_id)).event_count == before
    await runtime.control.resume(run_id, {"answer": good})
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert json.loads(tool_results(provider.calls[-1])[0]) == {"answer": good}


@pytest.mark.parametrize(("question", "good", "bad"), CASES)
async def test_each_question_type_parks_both_agent_kinds_on_its_answer_shape(
    runtime, providers, upstream_env, tmp_path, question, good, bad
):
    script = steps_script(lambda _: ("ask_user", question), lambda _: "answered")
    native_provider = providers(script)
    text = 'name = "asker"\n' + agent_toml(
        native_provider.base_url, extra='flow_tools = ["ask_user"]'
    )
    builtin = parse_definition(text, "toml", known_tools=runtime.kit.registry.names())
    await _asked(runtime, native_provider, builtin, question, good, bad)

    process_provider = providers(script)
    upstream_env(process_provider)
    await _asked(runtime, process_provider, salvor_agent(tmp_path), question, good, bad)
