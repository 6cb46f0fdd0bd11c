"""Authoring diagnostics: each problem of an agent definition (TOML, JSON, markdown) or a graph
document (YAML, JSON) at the line of the text it is about."""

from __future__ import annotations

import json

import pytest
import yaml
from salvor.daemon.agents import (
    DefinitionError,
    agent_diagnostics,
    graph_diagnostics,
    parse_definition,
)
from salvor.protocol import Diagnostic, Severity

TOOLS = ["lookup_invoice"]

TOML_CASES = [
    # (text, line, message fragment, suggestion)
    ('model = "m"\n\n[llm]\nprovider = "demoo"\n', 4, "[llm] provider must be one of", "demo"),
    ('model = "m"\n[llm]\nprovider = "demo"\nstreem = true\n', 4, "`streem`", "stream"),
    ('model = "m"\nflow_tools = ["ask_user", "ask_usr"]\n', 2, "unknown flow tool", "ask_user"),
    (
        'model = "m"\n[[tools]]\nname = "lookup_invoice"\n\n[[tools]]\nname = "lookup_invoce"\n',
        6,
        "unknown tool 'lookup_invoce'",
        "lookup_invoice",
    ),
    ('model = "m"\n[pricing]\ninput_per_mtok = 1\n', 2, "[pricing] needs output_per_mtok", None),
    ('name = "x"\n', 1, "`model` is required", None),
    ('model = "m"\nb = = 1\n', 2, "not valid TOML", None),
    ('model = "m"\nsystem_prompt = """\nmodel = 3\n"""\noutputs = "x"\n', 5, "`outputs`", None),
    ('model = "m"\nllm.provider = "zzz"\n', 2, "[llm] provider", None),
    # A value that reads like a parser's position is the field's, not where the fault is.
    ('model = "m"\n\n[[tools]]\nname = "at line 1, column 2"\n', 4, "unknown tool", None),
]


@pytest.mark.parametrize(("text", "line", "fragment", "suggestion"), TOML_CASES)
def test_a_toml_refusal_is_one_error_at_its_keys_line(text, line, fragment, suggestion):
    (found,) = agent_diagnostics(text, "toml", known_tools=TOOLS)
    assert (found.line, found.severity, found.suggestion) == (line, Severity.ERROR, suggestion)
    assert fragment in found.message


JSON_CASES = [
    ('{\n  "model": "m",\n  "llm": {\n    "provider": "x"\n  }\n}', 4, "[llm] provider"),
    (
        (
            '{\n  "model": "m",\n  "tools": [\n    {"name": "lookup_invoice"},\n'
            '    {"name": "zz"}\n  ]\n}'
        ),
        5,
        "unknown tool 'zz'",
    ),
    ('{\n  "model": "m",\n  "description": 7\n}', 3, "`description` must be a string"),
    ('{\n  "model": "m",\n}', 3, "not valid JSON"),
    ('{"model": "m", "system_prompt": "a \\" \\"llm\\": {", "budgets": {"stepz": 1}}', 1, "stepz"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), JSON_CASES)
def test_a_json_refusal_is_one_error_at_its_keys_line(text, line, fragment):
    (found,) = agent_diagnostics(text, "json", known_tools=TOOLS)
    assert (found.line, found.severity) == (line, Severity.ERROR)
    assert fragment in found.message


MD = "---\nname: reviewer\ndescription: d\nmodel: m\nllm:\n  provider: demo\n  stream: false\n"
MD_CASES = [
    (MD + "tools: ask_usr\n---\nHi.\n", 8, "did you mean `ask_user`?", "ask_user"),
    (MD.replace("provider: demo", "provider: demoo") + "---\nHi.\n", 6, "[llm] provider", "demo"),
    (MD + "toolz: ask_user\n---\nHi.\n", 8, "unknown key `toolz`", "tools"),
    (MD.replace("model: m\n", "") + "---\nHi.\n", 1, "`model` is required", None),
    (MD + "inputs: [a, a]\n---\nHi.\n", 8, "`inputs` names 'a' twice", None),
    (MD + "record_prompts: yes\n---\nHi.\n", 8, "`record_prompts` must be true or false", None),
    (MD + "model2: [x\n---\n", 9, "not valid", None),
    ("no front matter\n", 1, "opens with `---`", None),
]


@pytest.mark.parametrize(("text", "line", "fragment", "suggestion"), MD_CASES)
def test_a_markdown_refusal_is_one_error_at_its_front_matter_line(text, line, fragment, suggestion):
    (found,) = agent_diagnostics(text, "md", known_tools=TOOLS)
    assert (found.line, found.severity, found.suggestion) == (line, Severity.ERROR, suggestion)
    assert fragment in found.message


def test_a_valid_agent_has_no_diagnostics_and_a_markdown_one_without_description_a_warning():
    assert agent_diagnostics('model = "m"\n', "toml") == []
    assert agent_diagnostics(MD + "---\nHi.\n", "md") == []
    (warning,) = agent_diagnostics("---\nmodel: m\nname: terse\n---\n", "md")
    assert (warning.line, warning.severity) == (3, Severity.WARNING)
    assert "`description`" in warning.message
    assert warning.to_json()["severity"] == "warning"


def test_every_problem_of_an_agent_file_is_reported_at_once_each_with_its_suggestion():
    tools = ["lookup_invoice", "issue_refund"]
    text = MD + "tools: lookup_invoce, isue_refund, ask_user\ncolour: red\n---\nHi.\n"
    found = agent_diagnostics(text, "md", known_tools=tools)
    assert [(d.line, d.severity, d.suggestion) for d in found] == [
        (8, Severity.ERROR, "lookup_invoice"),
        (8, Severity.ERROR, "issue_refund"),
        (9, Severity.ERROR, None),
    ]
    assert "'lookup_invoce'" in found[0].message and "'isue_refund'" in found[1].message
    assert "unknown key `colour`" in found[2].message
    # TOML alike: each unknown key, each bad value, each unknown (flow) tool, by line.
    toml = (
        'model = "m"\nbogus = 1\nmax_response_tokens = 0\nflow_tools = ["ask_usr"]\n'
        '[[tools]]\nname = "lookup_invoce"\n[[tools]]\nname = "isue_refund"\n'
    )
    found = agent_diagnostics(toml, "toml", known_tools=tools)
    assert [(d.line, d.suggestion) for d in found] == [
        (2, None),
        (3, None),
        (4, "ask_user"),
        (6, "lookup_invoice"),
        (8, "issue_refund"),
    ]
    # Tools written as a block list: each unknown one at its own item's line.
    listed = MD + "tools:\n  - lookup_invoce\n  - ask_user\n  - isue_refund  # refunds\n---\nHi.\n"
    found = agent_diagnostics(listed, "md", known_tools=tools)
    assert [(d.line, d.suggestion) for d in found] == [(9, "lookup_invoice"), (11, "issue_refund")]
    # The parser still decides: each text refused here is refused by it, and a good one passes.
    for bad, fmt in ((text, "md"), (toml, "toml")):
        with pytest.raises(DefinitionError):
            parse_definition(bad, fmt, known_tools=tools)


def test_a_diagnostic_check_is_held_to_the_rules_of_a_definition_from_outside():
    # A file path and a command the daemon would run are refused, as over HTTP.
    (found,) = agent_diagnostics('model = "m"\nsystem_prompt_path = "/etc/passwd"\n', "toml")
    assert found.line == 2 and "daemon's own disk" in found.message
    (found,) = agent_diagnostics('kind = "process"\ncommand = ["true"]\n', "toml")
    assert found.line == 1 and "--allow-process-agents" in found.message
    assert (
        agent_diagnostics('kind = "process"\ncommand = ["true"]\n', "toml", allow_processes=True)
        == []
    )


# -- graphs ---------------------------------------------------------------------------------------

RESEARCHER = parse_definition(
    'name = "researcher"\nmodel = "m"\ninputs = ["topic", "depth"]\n', "toml"
)
AGENTS = {RESEARCHER.agent_def_hash: RESEARCHER}
GRAPH_YAML = f"""schema_version: 1
nodes:
  - id: research
    kind: agent
    agent: "{RESEARCHER.agent_def_hash}"
    input:
      topic: $input.topic
  - id: tell
    kind: tool
    tool: send_email
edges:
  - from: research
    to: tell
"""


def _as_json(text: str, change=None) -> str:
    document = yaml.safe_load(text)
    if change is not None:
        change(document)
    return json.dumps(document, indent=2)


def test_an_agent_node_that_does_not_wire_a_declared_input_is_warned_at_its_line():
    (warning,) = graph_diagnostics(GRAPH_YAML, AGENTS)
    assert warning == Diagnostic(
        line=3,
        severity=Severity.WARNING,
        message="agent node 'research' does not wire the declared input 'depth' of agent "
        "'researcher'",
        suggestion='input: {"depth": "$input.depth"}',
    )
    (warning,) = graph_diagnostics(_as_json(GRAPH_YAML), AGENTS)
    assert warning.line == 4 and "'depth'" in warning.message
    wired = GRAPH_YAML.replace("topic: $input.topic", "topic: $input.topic\n      depth: '2'")
    assert graph_diagnostics(wired, AGENTS) == []
    # A template handing the whole input on wires nothing by name, and is not second-guessed.
    whole = GRAPH_YAML.replace("    input:\n      topic: $input.topic\n", "    input: $input\n")
    assert graph_diagnostics(whole, AGENTS) == []


def test_an_agent_that_is_not_registered_is_an_error_with_the_nearest_registered_hash():
    (error,) = graph_diagnostics(GRAPH_YAML, {})
    assert (error.line, error.severity, error.suggestion) == (3, Severity.ERROR, None)
    assert "not registered" in error.message
    registered = {RESEARCHER.agent_def_hash: "researcher"}
    typo = RESEARCHER.agent_def_hash[:-1] + ("0" if RESEARCHER.agent_def_hash[-1] != "0" else "1")
    (error,) = graph_diagnostics(
        GRAPH_YAML.replace(RESEARCHER.agent_def_hash, typo), {}, registered
    )
    assert error.suggestion == RESEARCHER.agent_def_hash
    # A hash nowhere near: the agent named as the node is, when there is one.
    other = "sha256:" + "0" * 64
    renamed = GRAPH_YAML.replace(RESEARCHER.agent_def_hash, other).replace(
        "    kind: agent\n", "    kind: agent\n    name: researcher\n"
    )
    (error,) = graph_diagnostics(renamed, {}, registered)
    assert error.suggestion == RESEARCHER.agent_def_hash


FIVE = parse_definition(
    'name = "researcher"\nmodel = "m"\ninputs = ["topic", "depth"]\n'
    'outputs = [{name = "verdict"}]\n',
    "toml",
)
FIVE_PROBLEMS = """schema_version: 1
nodes:
  - id: research
    kind: agent
    agent: "HASH"
    input:
      topic: $input.topic
  - id: check
    kind: agent
    agent: "TYPO"
  - id: route
    kind: branch
    on: $nodes.research.outputs.verdikt
    cases: [approve, reject]
  - id: check
    kind: gate
    prompt: Ready?
edges:
  - from: research
    to: route
  - from: route
    to: check
    case: approve
  - from: route
    to: check
    case: reject
  - from: research
    to: tel
"""


def five_problems(agent_hash: str) -> str:
    """A flow with five problems, each on its own line: an input not wired (3), an agent not
    registered (8, its hash one character off), an output the agent does not declare (11), a
    repeated id (15) and an edge to no node (27)."""
    typo = agent_hash[:-1] + ("0" if agent_hash[-1] != "0" else "1")
    return FIVE_PROBLEMS.replace("HASH", agent_hash).replace("TYPO", typo)


def test_a_flow_with_five_problems_gets_five_diagnostics_each_on_its_line():
    text = five_problems(FIVE.agent_def_hash)
    found = graph_diagnostics(text, {FIVE.agent_def_hash: FIVE}, {FIVE.agent_def_hash: None})
    assert [(d.line, d.severity.value) for d in found] == [
        (3, "warning"),
        (8, "error"),
        (11, "warning"),
        (15, "error"),
        (27, "error"),
    ]
    assert "'depth'" in found[0].message
    assert found[1].suggestion == FIVE.agent_def_hash
    assert found[2].suggestion == "$nodes.research.outputs.verdict"
    assert "used by an earlier node" in found[3].message and "no node 'tel'" in found[4].message


def _errors(text: str, agents) -> list[Diagnostic]:
    """The errors of ``text`` (its agent node's unwired input is warned of besides)."""
    return [d for d in graph_diagnostics(text, agents) if d.severity is Severity.ERROR]


def test_validation_errors_are_errors_at_the_line_of_their_node_or_edge():
    (edge,) = _errors(GRAPH_YAML.replace("to: tell", "to: tel"), AGENTS)
    assert (edge.line, edge.severity, edge.suggestion) == (12, Severity.ERROR, "tell")
    assert "no node 'tel'" in edge.message
    # A malformed node stops the check there, at the node's line.
    (blank,) = _errors(GRAPH_YAML.replace("tool: send_email", "tool: ''"), AGENTS)
    assert (blank.line, blank.severity) == (8, Severity.ERROR)
    assert "nodes[1] ('tell').tool" in blank.message

    def mistype(document):
        document["edges"][0]["to"] = "tel"

    text = _as_json(GRAPH_YAML, mistype)
    (edge,) = _errors(text, AGENTS)
    # The JSON text's edges[0] opens on the line after `"edges": [`.
    assert edge.line == text.split("\n").index('  "edges": [') + 2 == 19
    assert edge.suggestion == "tell"

    def bad_kind(document):
        document["nodes"][1]["kind"] = "toool"

    (malformed,) = _errors(_as_json(GRAPH_YAML, bad_kind), AGENTS)
    assert "nodes[1]" in malformed.message and malformed.line == 12


@pytest.mark.parametrize(
    ("text", "line"),
    [("schema_version: 1\nnodes: [\n", 3), ('{"schema_version": 1,\n "nodes": [\n', 3)],
)
def test_a_document_that_does_not_parse_is_one_error_at_the_line_it_stops(text, line):
    (found,) = graph_diagnostics(text, {})
    assert (found.line, found.severity) == (line, Severity.ERROR)
