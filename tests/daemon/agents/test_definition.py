"""Agent definitions: strict validation, TOML and JSON alike, and a content hash
that ignores the display name."""

from __future__ import annotations

import json

import pytest
from salvor.daemon.agents._definition import DefinitionError, load_definition, parse_definition
from salvor.protocol import sha256_hash

TOOLS = ["lookup_invoice", "issue_refund", "send_email"]
TOML = """
name = "refund-desk"
model = "claude-sonnet-4-5"
system_prompt = "You settle refund requests."
max_response_tokens = 512

[llm]
provider = "openai"
base_url_env = "MY_BASE"
api_key_env = "MY_KEY"
max_retries = 2
timeout_seconds = 30

[budgets]
steps = 24
tokens = 400000
cost_usd = 2.5
wall_time_seconds = 900

[pricing]
input_per_mtok = 3.0
output_per_mtok = 15.0

[output_schema]
type = "object"
required = ["verdict"]

[[tools]]
name = "lookup_invoice"
"""


def test_a_full_definition_parses_with_every_field():
    agent = parse_definition(TOML, "toml", known_tools=TOOLS)
    assert agent.name == "refund-desk"
    assert agent.model == "claude-sonnet-4-5"
    assert agent.max_response_tokens == 512
    assert agent.llm.provider == "openai" and agent.llm.base_url_env == "MY_BASE"
    assert agent.budgets == {
        "steps": 24,
        "tokens": 400000,
        "cost_usd": 2.5,
        "wall_time_seconds": 900,
    }
    assert agent.output_schema == {"type": "object", "required": ["verdict"]}
    assert agent.tools == ("lookup_invoice",)
    assert agent.agent_def_hash.startswith("sha256:") and len(agent.agent_def_hash) == 71


def test_the_name_plays_no_part_in_the_hash_and_json_equals_toml():
    agent = parse_definition(TOML, "toml", known_tools=TOOLS)
    renamed = parse_definition(
        TOML.replace('name = "refund-desk"', 'name = "support-triage"'), "toml", known_tools=TOOLS
    )
    unnamed = parse_definition(
        TOML.replace('name = "refund-desk"\n', ""), "toml", known_tools=TOOLS
    )
    assert agent.agent_def_hash == renamed.agent_def_hash == unnamed.agent_def_hash
    import tomllib

    as_json = json.dumps(tomllib.loads(TOML))
    assert (
        parse_definition(as_json, "json", known_tools=TOOLS).agent_def_hash == agent.agent_def_hash
    )
    changed = parse_definition(TOML.replace("steps = 24", "steps = 25"), "toml", known_tools=TOOLS)
    assert changed.agent_def_hash != agent.agent_def_hash
    # Anyone can recompute it: sha256 over RFC 8785 JSON of the definition without its name.
    raw = tomllib.loads(TOML)
    del raw["name"]
    assert agent.agent_def_hash == sha256_hash(raw)


def test_a_prompt_file_is_inlined_into_the_stored_copy(tmp_path):
    (tmp_path / "prompt.md").write_text("Be brief.")
    path = tmp_path / "agent.toml"
    path.write_text('model = "m"\nsystem_prompt_path = "prompt.md"\n')
    agent = load_definition(path)
    assert agent.system_prompt == "Be brief."
    assert agent.stored_format == "json"
    rebuilt = parse_definition(agent.stored_text, "json")
    assert rebuilt.agent_def_hash == agent.agent_def_hash
    assert (
        agent.agent_def_hash
        == parse_definition('model = "m"\nsystem_prompt = "Be brief."\n', "toml").agent_def_hash
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('model = "m"\n[llm]\nproviderr = "openai"\n', "unknown field `providerr` in [llm]"),
        ('model = "m"\n[budgets]\nstepz = 1\n', "unknown field `stepz` in [budgets]"),
        ('model = "m"\n[budgets]\nsteps = 0\n', "positive number"),
        ('model = "m"\n[budgets]\ntokens = "many"\n', "positive number"),
        ('model = "m"\nmax_response_tokens = -1\n', "positive integer"),
        ('model = "m"\nrecord_prompts = "yes"\n', "true or false"),
        ('model = "m"\nsystem_prompt = "a"\nsystem_prompt_path = "b"\n', "not both"),
        (
            'model = "m"\nsystem_prompt_path = "/nonexistent/prompt.md"\n',
            "cannot read system_prompt_path",
        ),
        ('model = "m"\n[output_schema]\ntype = 5\n', "[output_schema]"),
        (
            'model = "m"\n[[tools]]\nname = "lookup_invoice"\n[[tools]]\nname = "lookup_invoice"\n',
            "listed twice",
        ),
        ('model = "m"\n[[tools]]\nnam = "x"\n', "unknown field `nam` in [[tools]]"),
        (
            'model = "m"\nkind = "process"\ncommand = ["true"]\n',
            "unknown field `model` in a process agent",
        ),
        ('kind = "process"\n', "a process agent needs `command`"),
        ('kind = "cron"\nurl = "http://x"\n', "`kind` must be one of"),
        (
            'model = "m"\n[[mcp_servers]]\ncommand = "npx"\nurl = "http://x"\n',
            "exactly one of `command`",
        ),
        ('model = ""\n', "`model` is required"),
        ('model = "m"\n[pricing]\ninput_per_mtok = 1\n', "[pricing] needs output_per_mtok"),
        ('model = "m"\n[llm]\nmax_retries = 99\n', "from 0 to 20"),
    ],
)
def test_every_invalid_field_is_named(text, fragment):
    with pytest.raises(DefinitionError) as refused:
        parse_definition(text, "toml", known_tools=TOOLS)
    assert fragment in str(refused.value)


def test_invalid_json_is_refused():
    with pytest.raises(DefinitionError, match="not valid JSON"):
        parse_definition("{", "json")
