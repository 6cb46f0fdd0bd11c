"""Markdown agent files: front matter and a body, read as the TOML definition of the same fields
(and so hashed alike), refused loudly with the key each refusal is about."""

from __future__ import annotations

import pytest
from salvor.daemon.agents import DefinitionError, load_definition, parse_definition
from salvor.protocol import DeclaredOutput, FlowTool

TOOLS = ["lookup_invoice", "issue_refund"]
REVIEWER_MD = """---
name: reviewer
description: Reviews a refund before it is paid.
model: claude-sonnet-4-5
tools: ask_user, lookup_invoice, finish
inputs: [invoice_id]
outputs:
  - name: verdict
  - name: amount
    type: number
    required: false
max_response_tokens: 512
llm:
  provider: demo
budgets:
  steps: 8
card:
  label: Reviewer
  metric: refunds
architect:
  use_when: a refund needs a second look
---

You review refunds.

Ask when unsure.

"""
# The same agent as TOML: the markdown file stands for exactly this.
REVIEWER_TOML = """
name = "reviewer"
description = "Reviews a refund before it is paid."
model = "claude-sonnet-4-5"
flow_tools = ["ask_user", "finish"]
inputs = ["invoice_id"]
outputs = [{name = "verdict"}, {name = "amount", type = "number", required = false}]
max_response_tokens = 512
system_prompt = "You review refunds.\\n\\nAsk when unsure."
[llm]
provider = "demo"
[budgets]
steps = 8
[[tools]]
name = "lookup_invoice"
"""


def test_a_markdown_file_is_the_toml_definition_of_its_fields():
    agent = parse_definition(REVIEWER_MD, "md", known_tools=TOOLS)
    twin = parse_definition(REVIEWER_TOML, "toml", known_tools=TOOLS)
    assert agent.agent_def_hash == twin.agent_def_hash
    assert agent.name == "reviewer"
    assert agent.system_prompt == "You review refunds.\n\nAsk when unsure."
    assert agent.flow_tools == (FlowTool.ASK_USER, FlowTool.FINISH)
    assert agent.tools == ("lookup_invoice",)
    assert agent.outputs[1] == DeclaredOutput("amount", "number", required=False)
    assert (agent.max_response_tokens, agent.llm.provider, agent.budgets) == (
        512,
        "demo",
        {"steps": 8},
    )
    # The display metadata is kept for the catalog, and like the name plays no part in the hash.
    assert agent.card == {"label": "Reviewer", "metric": "refunds"}
    assert agent.architect == {"use_when": "a refund needs a second look"}
    assert twin.card is None
    # The store keeps the file itself, which rebuilds the same agent.
    assert (agent.stored_format, agent.stored_text) == ("md", REVIEWER_MD)
    rebuilt = parse_definition(agent.stored_text, "md", known_tools=TOOLS, stored=True)
    assert rebuilt.agent_def_hash == agent.agent_def_hash


def test_tools_may_be_a_list_and_line_ends_may_be_crlf():
    listed = REVIEWER_MD.replace(
        "tools: ask_user, lookup_invoice, finish", "tools: [ask_user, lookup_invoice, finish]"
    )
    crlf = REVIEWER_MD.replace("\n", "\r\n")
    expected = parse_definition(REVIEWER_TOML, "toml", known_tools=TOOLS).agent_def_hash
    for text in (listed, crlf):
        assert parse_definition(text, "md", known_tools=TOOLS).agent_def_hash == expected


def test_a_bare_file_is_just_its_name_and_model():
    agent = parse_definition("---\nname: terse\nmodel: m\ntools:\n---\n", "md")
    assert agent.agent_def_hash == parse_definition('model = "m"\n', "toml").agent_def_hash
    assert (agent.system_prompt, agent.tools, agent.flow_tools) == (None, (), ())


def test_a_markdown_file_loads_from_disk(tmp_path):
    path = tmp_path / "reviewer.md"
    path.write_text(REVIEWER_MD, encoding="utf-8")
    agent = load_definition(path, known_tools=TOOLS)
    assert agent.stored_format == "md" and agent.name == "reviewer"


@pytest.mark.parametrize(
    ("text", "fragment", "at", "suggestion"),
    [
        ("name: x\nmodel: m\n", "opens with `---`", (), None),
        ("---\nname: x\nmodel: m\n", "never closed", (), None),
        (
            "---\nname: x\nmodel: m\ntoolz: ask_user\n---\n",
            "unknown key `toolz` in the front matter (did you mean `tools`?)",
            ("toolz",),
            "tools",
        ),
        ("---\nname: x\nmodel: m\nkind: process\n---\n", "unknown key `kind`", ("kind",), None),
        ("---\nmodel: m\n---\n", "needs `name`", ("name",), None),
        ("---\nname: x\n---\nHi.\n", "a built-in agent names the model", ("model",), None),
        (
            "---\nname: x\nmodel: m\ntools: {a: 1}\n---\n",
            "comma-separated string or a list",
            ("tools",),
            None,
        ),
        (
            "---\nname: x\nmodel: m\ntools: ask_usr\n---\n",
            "(did you mean `ask_user`?)",
            ("tools", 0, "name"),
            "ask_user",
        ),
        (
            "---\nname: x\nmodel: m\ncard: [a]\n---\n",
            "`card` (line 4) must be a table of strings",
            ("card",),
            None,
        ),
        ("---\nname: x\nmodel: m\nwhen: 2024-01-01\n---\n", "timestamp", (), None),
        ("---\n- a\n---\n", "must be a table of keys", (), None),
    ],
)
def test_a_refusal_names_the_key(text, fragment, at, suggestion):
    with pytest.raises(DefinitionError) as refused:
        parse_definition(text, "md", known_tools=TOOLS)
    assert fragment in str(refused.value)
    assert refused.value.at == at
    assert refused.value.suggestion == suggestion


def test_a_yaml_error_names_the_files_line():
    with pytest.raises(DefinitionError, match="line 3") as refused:
        parse_definition("---\nname: x\nmodel: m: n\n---\n", "md")
    assert "front matter" in str(refused.value)
