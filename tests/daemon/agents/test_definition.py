"""Agent definitions: strict validation, TOML and JSON alike, and a content hash
that ignores the display name."""

from __future__ import annotations

import json
import tomllib

import pytest
from salvor.daemon.agents import offered_besides_mcp
from salvor.daemon.agents._definition import DefinitionError, load_definition, parse_definition
from salvor.daemon.mcp import McpBuildError, exposed_tools, parse_mcp_servers
from salvor.protocol import DeclaredInput, DeclaredOutput, FlowTool, sha256_hash

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


# -- the flow fields ------------------------------------------------------------------------------

FLOW_AGENT = """
name = "reviewer"
model = "m"
description = "Reviews a change and says whether it may land."
flow_tools = ["ask_user", "subagent"]
inputs = ["diff", {name = "ticket", description = "The ticket it answers"}]
outputs = ["verdict", {name = "score", type = "number", required = false}]
[llm]
provider = "demo"
"""


def test_a_built_in_agent_takes_the_flow_fields_and_they_are_part_of_the_hash():
    agent = parse_definition(FLOW_AGENT, "toml")
    assert agent.description == "Reviews a change and says whether it may land."
    assert agent.flow_tools == (FlowTool.ASK_USER, FlowTool.SUBAGENT)
    assert agent.inputs == (DeclaredInput("diff"), DeclaredInput("ticket", "The ticket it answers"))
    assert agent.outputs == (
        DeclaredOutput("verdict"),
        DeclaredOutput("score", "number", required=False),
    )
    # finish is offerable too: a child session returns the declared outputs through it.
    assert agent.offerable_flow_tools == (FlowTool.ASK_USER, FlowTool.SUBAGENT, FlowTool.FINISH)
    raw = tomllib.loads(FLOW_AGENT)
    del raw["name"]
    assert agent.agent_def_hash == sha256_hash(raw)


def test_each_flow_field_changes_the_hash_and_none_is_defaulted_into_it():
    plain = parse_definition('model = "m"\n', "toml")
    assert (plain.description, plain.flow_tools, plain.inputs, plain.outputs) == (None, (), (), ())
    assert plain.agent_def_hash == sha256_hash({"model": "m"})
    hashes = {plain.agent_def_hash}
    for extra in (
        'description = "d"',
        'flow_tools = ["ask_user"]',
        'inputs = ["a"]',
        'outputs = ["a"]',
        "flow_tools = []",
    ):
        hashes.add(parse_definition(f'model = "m"\n{extra}\n', "toml").agent_def_hash)
    assert len(hashes) == 6


# Definitions written before the flow fields existed, with the hash main's parser (before it knew
# them) registered each under: a field the parser gains must never move them, since runs recorded
# against them resume by hash.
_PINNED = [
    (
        'model = "m"\n',
        "toml",
        "sha256:548f58d1c36c715b44f0863472074a97c448d5b8d18164b92adf55592b127f86",
    ),
    (TOML, "toml", "sha256:9b3692501b71615db4c2eea70abf818b0d6d8dbaaa7d95459844e7b088fb7398"),
    (
        'kind = "process"\ncommand = ["python", "agent.py"]\ntimeout = 60\n',
        "toml",
        "sha256:665287db18059f67834c9d6db8abddfae817fadb04ca45c604aa4e4eee0e1cc7",
    ),
    (
        'kind = "service"\nurl = "http://127.0.0.1:9/go"\nproxy_port = 4100\n',
        "toml",
        "sha256:7b952ad3d77757c87af356e98233e30a8662b7bd6cd8e467795f2cc766c51e01",
    ),
    (
        '{"model": "m", "llm": {"provider": "demo"}, "budgets": {"steps": 3}}',
        "json",
        "sha256:01480ca4384c73ed973f450f5da9ac1ae94061c07fdb70b49af9f98fbace1a42",
    ),
]


@pytest.mark.parametrize(("text", "fmt", "recorded"), _PINNED)
def test_an_existing_definitions_hash_is_unchanged(text, fmt, recorded):
    agent = parse_definition(text, fmt, known_tools=TOOLS)
    assert agent.agent_def_hash == recorded
    assert (agent.description, agent.flow_tools, agent.inputs, agent.outputs) == (None, (), (), ())
    assert (agent.salvor_mcp, agent.output_from) == (True, "model")


@pytest.mark.parametrize(
    ("text", "fragment", "at", "suggestion"),
    [
        (
            'flow_tools = ["ask_usr"]',
            "unknown flow tool 'ask_usr' (did you mean `ask_user`?)",
            ("flow_tools", 0),
            "ask_user",
        ),
        (
            'flow_tools = ["finish", "finish"]',
            "flow tool 'finish' is listed twice",
            ("flow_tools", 1),
            None,
        ),
        ('flow_tools = "ask_user"', "`flow_tools` must be an array", ("flow_tools",), None),
        ("flow_tools = [3]", "`flow_tools` must be an array of strings", ("flow_tools", 0), None),
        ("description = 3", "`description` must be a string", ("description",), None),
        (f'description = "{"x" * 1025}"', "at most 1024 characters", ("description",), None),
        ('inputs = ["a", "a"]', "`inputs` names 'a' twice", ("inputs",), None),
        ('inputs = "a"', "`inputs` must be an array", ("inputs",), None),
        ('outputs = [{name = "v", type = "date"}]', "`type` must be one of", ("outputs",), None),
        ('outputs = ["status"]', "which finish uses for itself", ("outputs",), None),
        (
            '[[tools]]\nname = "finish"',
            "'finish' is a flow tool: list it in `flow_tools`",
            ("tools", 0, "name"),
            None,
        ),
        (
            '[[tools]]\nname = "lookup_invoic"',
            "unknown tool 'lookup_invoic' (did you mean `lookup_invoice`?)",
            ("tools", 0, "name"),
            "lookup_invoice",
        ),
        (
            "salvor_mcp = false",
            "unknown field `salvor_mcp` in the definition",
            ("salvor_mcp",),
            None,
        ),
        (
            '[llm]\nprovidr = "demo"',
            "unknown field `providr` in [llm] (did you mean `provider`?)",
            ("llm", "providr"),
            "provider",
        ),
    ],
)
def test_a_refused_flow_field_names_itself_and_where_it_is(text, fragment, at, suggestion):
    with pytest.raises(DefinitionError) as refused:
        parse_definition(f'model = "m"\n{text}\n', "toml", known_tools=[*TOOLS, "finish"])
    assert fragment in str(refused.value)
    assert refused.value.at == at
    assert refused.value.suggestion == suggestion


PROCESS = 'kind = "process"\ncommand = ["python", "agent.py"]\n'


def test_a_process_agent_takes_its_flow_fields():
    agent = parse_definition(
        PROCESS + 'description = "d"\ninputs = ["task"]\noutputs = ["answer"]\n'
        'salvor_mcp = false\noutput_from = "stdout"\n',
        "toml",
    )
    assert (agent.description, agent.salvor_mcp, agent.output_from) == ("d", False, "stdout")
    assert agent.inputs == (DeclaredInput("task"),)
    assert agent.outputs == (DeclaredOutput("answer"),)
    plain = parse_definition(PROCESS, "toml")
    assert (plain.salvor_mcp, plain.output_from) == (True, "model")
    assert plain.agent_def_hash == sha256_hash(tomllib.loads(PROCESS))
    assert parse_definition(PROCESS + "salvor_mcp = true\n", "toml").agent_def_hash != (
        plain.agent_def_hash
    )


@pytest.mark.parametrize(
    ("text", "fragment", "at"),
    [
        ('salvor_mcp = "no"', "`salvor_mcp` must be true or false", ("salvor_mcp",)),
        (
            'output_from = "stdin"',
            "`output_from` must be one of 'model', 'stdout'",
            ("output_from",),
        ),
        (
            'flow_tools = ["ask_user"]',
            "unknown field `flow_tools` in a process agent",
            ("flow_tools",),
        ),
        ('outputs = [{name = "a", kind = "x"}]', "`outputs` entry 1 must be", ("outputs",)),
    ],
)
def test_a_process_agents_flow_fields_are_checked(text, fragment, at):
    with pytest.raises(DefinitionError) as refused:
        parse_definition(PROCESS + text + "\n", "toml")
    assert fragment in str(refused.value)
    assert refused.value.at == at


def test_a_service_agent_takes_no_flow_fields():
    service = 'kind = "service"\nurl = "http://127.0.0.1:9/go"\nproxy_port = 4100\n'
    with pytest.raises(DefinitionError, match="unknown field `salvor_mcp` in a service agent"):
        parse_definition(service + "salvor_mcp = false\n", "toml")


def test_the_flow_tools_an_agent_may_be_offered_collide_with_its_mcp_tools():
    agent = parse_definition(FLOW_AGENT, "toml")
    taken = offered_besides_mcp(agent)
    assert {"ask_user", "subagent", "finish"} <= set(taken)
    assert "flow_results" not in taken
    server = parse_mcp_servers([{"name": "people", "command": ["people"]}])
    with pytest.raises(McpBuildError, match="'ask_user' of MCP server 'people' has the same name"):
        exposed_tools(server, {"people": [{"name": "ask_user", "inputSchema": {}}]}, taken)


@pytest.mark.parametrize(
    ("field", "says"),
    [
        ("description", "`description` must be a string"),
        ("outputs", "`outputs` must be an array"),
        ("inputs", "`inputs` must be an array"),
        ("flow_tools", "`flow_tools` must be an array"),
    ],
)
def test_a_null_flow_field_is_refused_not_read_as_absent(field, says):
    # JSON can say null where TOML cannot; the document describes each of these as non-nullable.
    text = json.dumps({"model": "m", "llm": {"provider": "demo"}, field: None})
    with pytest.raises(DefinitionError, match=says):
        parse_definition(text, "json")
    nested = {"model": "m", "llm": {"provider": "demo"}, "outputs": [{"name": "v", field: None}]}
    if field == "description":
        with pytest.raises(DefinitionError, match="`description` must be a string"):
            parse_definition(json.dumps(nested), "json")
