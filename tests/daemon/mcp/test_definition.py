"""`[[mcp_servers]]` in built-in agent definitions: strict validation and what the hash covers."""

from __future__ import annotations

import pytest
from salvor.daemon.agents._definition import DefinitionError, parse_definition
from salvor.daemon.mcp import McpDefinitionError, parse_mcp_servers
from salvor.protocol import Effect

HEAD = 'model = "m"\n'


def parse(servers: str, **kwargs):
    return parse_definition(HEAD + servers, "toml", **kwargs)


def test_a_stdio_and_an_http_server_parse():
    agent = parse(
        '[[mcp_servers]]\nname = "fs"\ncommand = "npx -y server ./sandbox"\nenv = { A = "1" }\n'
        'cwd = "/tmp"\neffects = { read_file = "read", pay = "idempotent" }\ntools = '
        '["read_file", "pay", "wipe"]\n'
        "results = { wipe = { ok = true } }\ntimeout = 5\n"
        '[[mcp_servers]]\nname = "web"\nurl = "https://tools.example.com/mcp"\n'
        'headers = { Authorization = "Bearer ${TOKEN}" }\n'
    )
    fs, web = agent.mcp_servers
    assert (
        fs.command == ("npx", "-y", "server", "./sandbox")
        and fs.env == {"A": "1"}
        and fs.cwd == "/tmp"
    )
    assert fs.transport == "stdio" and fs.timeout == 5.0 and fs.results == {"wipe": {"ok": True}}
    assert fs.effect_of("read_file") is Effect.READ and fs.effect_of("pay") is Effect.IDEMPOTENT
    assert fs.effect_of("anything_else") is Effect.WRITE
    assert fs.exposes("wipe") and not fs.exposes("format_disk")
    assert web.transport == "http" and web.headers == {"Authorization": "Bearer ${TOKEN}"}
    assert web.reads_environment() and not fs.reads_environment()


def test_idempotency_keys_parse_one_path_or_many_for_any_tool_name():
    # DESIGN.md's agent-file example form, and an array of dotted paths; the
    # server's tools are known only at run time, so no name is checked here.
    (server,) = parse(
        '[[mcp_servers]]\nname = "pay"\ncommand = "x"\n'
        'idempotency_keys = { pay_claim = "claim_id", refund = ["invoice", "order.id"] }\n'
    ).mcp_servers
    assert server.key_paths("pay_claim") == ("claim_id",)
    assert server.key_paths("refund") == ("invoice", "order.id")
    assert server.key_paths("lookup") == ()


def test_idempotency_keys_on_a_process_agents_servers_are_accepted_and_checked():
    # Its calls go through salvor's stand-ins, which claim the identity as a built-in call does.
    agent = parse_definition(
        'kind = "process"\ncommand = ["agent"]\n'
        '[[mcp_servers]]\nname = "pay"\nurl = "http://h/mcp"\nport = 8123\n'
        'effects = { pay = "write" }\nidempotency_keys = { pay = "invoice.id" }\n',
        "toml",
    )
    assert agent.mcp_servers[0].key_paths("pay") == ("invoice.id",)
    bad = {"name": "pay", "url": "http://h/mcp", "idempotency_keys": {"pay": "a..b"}}
    with pytest.raises(McpDefinitionError, match="not a dotted input path"):
        parse_mcp_servers([bad], stand_ins=True)


PAY = (
    '[[mcp_servers]]\nname = "pay"\ncommand = "x"\n'
    'effects = { refund = "write", find = "read", send = "idempotent" }\n'
)


def probes(table: str, effects: str = "") -> str:
    return PAY + effects + table


def test_a_probe_names_a_read_of_the_same_server_for_a_write():
    (server,) = parse(
        probes(
            "[mcp_servers.probes.refund]\n"
            'tool = "find"\ninput = { invoice = "order.invoice" }\nlanded = "found"\n'
            'output = "refund"\n'
        )
    ).mcp_servers
    probe = server.probe_of("refund")
    assert (probe.tool, dict(probe.input), probe.landed, probe.output) == (
        "find",
        {"invoice": "order.invoice"},
        "found",
        "refund",
    )
    assert server.probe_of("find") is None


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ("probes = 3\n", "`probes` must be a table of write tool name"),
        (
            '[mcp_servers.probes.send]\ntool = "find"\ninput = {}\nlanded = "ok"\n',
            "`probes.send` probes a tool not declared `write` in `effects`",
        ),
        (
            '[mcp_servers.probes.other]\ntool = "find"\ninput = {}\nlanded = "ok"\n',
            "`probes.other` probes a tool not declared `write`",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = "send"\ninput = {}\nlanded = "ok"\n',
            "names the probe 'send', which is not declared `read` in `effects`",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = "refund"\ninput = {}\nlanded = "ok"\n',
            "names the probe 'refund', which is not declared `read`",
        ),
        (
            '[mcp_servers.probes.refund]\ninput = {}\nlanded = "ok"\n',
            "`probes.refund` needs `tool`",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = "find"\nlanded = "ok"\n',
            "`probes.refund` needs `input`",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = "find"\ninput = {}\n',
            "`probes.refund` needs `landed`",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = "find"\ninput = {}\nlanded = "ok"\nwhen = 1\n',
            "`probes.refund` has the unknown field `when`",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = "find"\ninput = { id = 3 }\nlanded = "ok"\n',
            "`input` entry 'id' must be a dotted path",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = "find"\ninput = ["id"]\nlanded = "ok"\n',
            "`input` must be a table of probe input field",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = "find"\ninput = {}\nlanded = "a..b"\n',
            "`landed` must be a dotted path",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = "find"\ninput = {}\nlanded = "ok"\noutput = 1\n',
            "`output` must be a dotted path",
        ),
        (
            '[mcp_servers.probes.refund]\ntool = ""\ninput = {}\nlanded = "ok"\n',
            "`tool` must name a tool of this server",
        ),
        (
            (
                'tools = ["refund", "find", "send"]\n[mcp_servers.probes.refund]\ntool = "look"\n'
                'input = {}\nlanded = "ok"\n'
            ),
            "names the probe 'look', which `tools` does not expose",
        ),
    ],
)
def test_every_invalid_probe_field_is_named_in_one_sentence(table, fragment):
    with pytest.raises(DefinitionError) as refused:
        parse(probes(table))
    message = str(refused.value)
    assert fragment in message and "[[mcp_servers]] 'pay':" in message
    assert message.count(". ") == 0


def test_probes_on_a_service_agents_servers_are_refused_naming_the_field():
    entry = {
        "name": "pay",
        "url": "http://h/mcp",
        "effects": {"refund": "write", "find": "read"},
        "probes": {"refund": {"tool": "find", "input": {}, "landed": "ok"}},
    }
    with pytest.raises(McpDefinitionError, match="`probes` is not supported for a service"):
        parse_mcp_servers([entry], stand_ins=True, probes=False)
    # A process agent's servers (stand-ins) and a built-in agent's take them.
    assert parse_mcp_servers([entry], stand_ins=True)[0].probe_of("refund").tool == "find"
    assert parse_mcp_servers([entry])[0].probe_of("refund").tool == "find"


def test_the_reference_file_format_is_accepted():
    # The format DESIGN.md shows: no name, a program plus `args`, `effect_overrides`.
    agent = parse(
        '[[mcp_servers]]\ncommand = "npx"\nargs = ["-y", '
        '"@modelcontextprotocol/server-filesystem", "./sandbox"]\nenv = { }\neffect_overrides = { '
        'read_text_file = "read", write_file = "write" }\n'
    )
    (server,) = agent.mcp_servers
    assert server.name == "server1"
    assert server.command == ("npx", "-y", "@modelcontextprotocol/server-filesystem", "./sandbox")
    assert server.effect_of("read_text_file") is Effect.READ


def test_the_hash_covers_the_servers_as_written():
    base = '[[mcp_servers]]\nname = "w"\nurl = "http://127.0.0.1:1/mcp"\n'
    plain = parse(base)
    assert parse(base).agent_def_hash == plain.agent_def_hash
    for change in (
        'headers = { X-Key = "${KEY}" }\n',
        'effects = { t = "read" }\n',
        "results = { t = 1 }\n",
        'tools = ["t"]\n',
        "timeout = 3\n",
    ):
        assert parse(base + change).agent_def_hash != plain.agent_def_hash, change
    # A placeholder is hashed unresolved: the variable's value is never part of it.
    assert parse(base + 'headers = { X-Key = "${KEY}" }\n').stored_text.count("${KEY}") == 1


@pytest.mark.parametrize(
    ("servers", "fragment"),
    [
        ("mcp_servers = 3\n", "`mcp_servers` must be an array of tables"),
        ('[[mcp_servers]]\nname = "a"\n', "exactly one of `command`"),
        ('[[mcp_servers]]\nname = "a b"\ncommand = "x"\n', "`name` must be 1 to 64 letters"),
        (
            (
                '[[mcp_servers]]\nname = "a"\ncommand = "x"\n'
                '[[mcp_servers]]\nname = "a"\ncommand = "y"\n'
            ),
            "two [[mcp_servers]] are named 'a'",
        ),
        ('[[mcp_servers]]\nname = "a"\ncommand = "x"\nport = 8931\n', "unknown field `port`"),
        ('[[mcp_servers]]\nname = "a"\ncommand = []\n', "`command` must name a program"),
        ('[[mcp_servers]]\nname = "a"\ncommand = "x \'open"\n', "`command` cannot be split"),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = ["x", 1]\n',
            "`command` must be an array of strings",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = ["x"]\nargs = ["y"]\n',
            "one program name when `args`",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\nheaders = { A = "b" }\n',
            "`headers` belongs to a `url` server",
        ),
        (
            '[[mcp_servers]]\nname = "a"\nurl = "http://h/mcp"\nenv = { A = "b" }\n',
            "`env` belongs to a stdio",
        ),
        (
            '[[mcp_servers]]\nname = "a"\nurl = "ftp://h/mcp"\n',
            "`url` must be an http:// or https:// URL",
        ),
        (
            '[[mcp_servers]]\nname = "a"\nurl = "http://h/mcp"\nheaders = { "A B" = "c" }\n',
            "is not an HTTP header name",
        ),
        (
            '[[mcp_servers]]\nname = "a"\nurl = "http://h/mcp"\nheaders = { A = "${TOKEN" }\n',
            "well-formed `${NAME}`",
        ),
        (
            (
                '[[mcp_servers]]\nname = "a"\nurl = "http://h/mcp"\nbearer_token_env = "T"\n'
                'headers = { authorization = "x" }\n'
            ),
            "`bearer_token_env` or an `Authorization` header",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\neffects = { t = "delete" }\n',
            "use read, idempotent or write",
        ),
        (
            (
                '[[mcp_servers]]\nname = "a"\ncommand = "x"\neffects = { t = "read" }\n'
                'effect_overrides = { t = "read" }\n'
            ),
            "the same field",
        ),
        ('[[mcp_servers]]\nname = "a"\ncommand = "x"\nresults = 1\n', "`results` must be a table"),
        ('[[mcp_servers]]\nname = "a"\ncommand = "x"\ntools = ["t", "t"]\n', "lists 't' twice"),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\ntools = ["t"]\neffects = { u = "read" }\n',
            "`effects` names 'u', which `tools` does not expose",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\ntools = ["t"]\nresults = { u = 1 }\n',
            "`results` names 'u', which `tools` does not expose",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\ntimeout = 0\n',
            "`timeout` must be a positive, finite",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\ntimeout = inf\n',
            "holds inf, which is not a JSON number",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\nidempotency_keys = ["id"]\n',
            "`idempotency_keys` must be a table of tool name",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\nidempotency_keys = { pay = 3 }\n',
            "`idempotency_keys` entry 'pay' must be a dotted input path",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\nidempotency_keys = { pay = [] }\n',
            "`idempotency_keys` entry 'pay' must be a dotted input path",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\nidempotency_keys = { pay = "a..b" }\n',
            "`idempotency_keys` entry 'pay' holds 'a..b', which is not a dotted input path",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\nidempotency_keys = { pay = [1] }\n',
            "`idempotency_keys` entry 'pay' holds 1, which is not a dotted input path",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\nidempotency_keys = { pay = ["a", "a"] }\n',
            "`idempotency_keys` entry 'pay' names one path twice",
        ),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "x"\nidempotency_keys = { pay = "tool" }\n',
            "`idempotency_keys` entry 'pay' names 'tool'",
        ),
    ],
)
def test_every_invalid_server_field_is_named(servers, fragment):
    with pytest.raises(DefinitionError) as refused:
        parse(servers)
    assert fragment in str(refused.value)


@pytest.mark.parametrize(
    ("servers", "allowed"),
    [
        ('[[mcp_servers]]\nname = "a"\ncommand = "x"\n', False),
        (
            '[[mcp_servers]]\nname = "a"\nurl = "http://h/mcp"\nheaders = { A = "${SECRET}" }\n',
            False,
        ),
        ('[[mcp_servers]]\nname = "a"\nurl = "http://h/mcp"\nbearer_token_env = "SECRET"\n', False),
        ('[[mcp_servers]]\nname = "a"\nurl = "http://h/mcp"\nheaders = { A = "plain" }\n', True),
    ],
)
def test_servers_the_daemon_runs_or_hands_its_environment_need_the_opt_in(servers, allowed):
    if allowed:
        parse(servers, allow_processes=False)
        return
    with pytest.raises(DefinitionError, match="--allow-process-agents"):
        parse(servers, allow_processes=False)
    parse(servers, allow_processes=True)


def test_a_probe_is_accepted_in_a_json_definition():
    import json

    definition = {
        "model": "m",
        "mcp_servers": [
            {
                "name": "pay",
                "command": ["x"],
                "effects": {"refund": "write", "find": "read"},
                "probes": {
                    "refund": {"tool": "find", "input": {"id": "invoice.id"}, "landed": "found"}
                },
            }
        ],
    }
    (server,) = parse_definition(json.dumps(definition), "json").mcp_servers
    probe = server.probe_of("refund")
    assert (probe.tool, dict(probe.input), probe.landed, probe.output) == (
        "find",
        {"id": "invoice.id"},
        "found",
        None,
    )
