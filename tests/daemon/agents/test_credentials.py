"""The operator's declarations, pure: which key goes to which endpoint, and what a flag may say."""

from __future__ import annotations

import pytest
from salvor.daemon.agents._credentials import (
    CredentialError,
    Credentials,
    Undeclared,
    normalise_endpoint,
    parse_mcp_origin,
    parse_model_endpoint,
)
from salvor.daemon.proxies import resolve_upstream

KEYS = {
    "ANTHROPIC_API_KEY": "a-key",
    "OPENAI_API_KEY": "o-key",
    "DESK_KEY": "desk",
    "SALVOR_AGENT_KEY": "agent",
}
ANTHROPIC, OPENAI = "https://api.anthropic.com", "https://api.openai.com"


def daemon(*flags: str, **environ: str) -> Credentials:
    return Credentials.for_daemon(flags, environ={**KEYS, **environ})


def llm(provider="anthropic", base_url=None, base_url_env=None, api_key_env=None) -> dict:
    return {
        "provider": provider,
        "base_url": base_url,
        "base_url_env": base_url_env,
        "api_key_env": api_key_env,
    }


@pytest.mark.parametrize(
    ("credentials", "settings", "expected"),
    [
        # The public hosts get their own key, whatever wire the definition speaks.
        (daemon(), llm(), (ANTHROPIC, "a-key")),
        (daemon(), llm("openai"), (OPENAI, "o-key")),
        (daemon(), llm("openai", base_url=ANTHROPIC + "/v1"), (ANTHROPIC + "/v1", "a-key")),
        (daemon(), llm("anthropic", base_url=OPENAI), (OPENAI, "o-key")),
        # The daemon-wide endpoint gets the provider's default key, as it always has.
        (daemon(SALVOR_MODEL_BASE_URL="http://local"), llm("openai"), ("http://local", "o-key")),
        # A flag's endpoint gets its own variable, normalised on / and /v1.
        (
            daemon("http://desk/,key_env=DESK_KEY"),
            llm(base_url="http://desk/v1/"),
            ("http://desk/v1/", "desk"),
        ),
        (daemon("http://desk"), llm(base_url="http://desk"), ("http://desk", None)),
        # An endpoint nobody declared gets no key in the daemon, not even one the definition
        # names (its drive is refused before it asks: ``check_reach``; this is the second lock).
        (daemon(), llm(base_url="http://elsewhere"), ("http://elsewhere", None)),
        (
            daemon(),
            llm(base_url="http://elsewhere", api_key_env="DESK_KEY"),
            ("http://elsewhere", None),
        ),
        (daemon(AIM="http://aimed"), llm(base_url_env="AIM"), ("http://aimed", None)),
        (daemon(), llm("demo", base_url="http://x"), (None, None)),
        # The command line: agent files resolve exactly as they always have.
        (
            Credentials(environ=KEYS),
            llm(base_url="http://elsewhere"),
            ("http://elsewhere", "a-key"),
        ),
        (Credentials(environ=KEYS), llm("openai", base_url=ANTHROPIC), (ANTHROPIC, "o-key")),
    ],
)
def test_the_key_that_goes_with_each_endpoint(credentials, settings, expected):
    endpoint = credentials.endpoint_for(**settings)
    assert (endpoint.base_url, endpoint.api_key) == expected


def test_a_key_file_and_the_systemd_credentials_are_read_once_at_start(tmp_path):
    (tmp_path / "desk.key").write_text("sk-file\n")
    (tmp_path / "anthropic-api-key").write_text("sk-systemd-a\n")
    (tmp_path / "agent-key").write_text("sk-agent\r\n")
    credentials = Credentials.for_daemon(
        [f"http://desk,key_file={tmp_path / 'desk.key'}"],
        environ={"CREDENTIALS_DIRECTORY": str(tmp_path)},
    )
    for path in tmp_path.iterdir():
        path.unlink()  # read at start: nothing is read again
    assert credentials.endpoint_for(**llm(base_url="http://desk")).api_key == "sk-file"
    assert credentials.endpoint_for(**llm()).api_key == "sk-systemd-a"
    assert credentials.endpoint_for(**llm("openai")).api_key is None
    assert credentials.upstream_key == "sk-agent"
    assert "sk-" not in repr(credentials) + repr(credentials.declared("http://desk"))
    assert "sk-" not in repr(credentials.endpoint_for(**llm(base_url="http://desk")))


def test_the_upstream_key_file_wins_over_the_variables(tmp_path):
    (tmp_path / "key").write_text("sk-from-file\n")
    credentials = Credentials.for_daemon(environ={"SALVOR_AGENT_KEY_FILE": str(tmp_path / "key")})
    upstream = resolve_upstream(
        {"SALVOR_AGENT_UPSTREAM": "http://up", "SALVOR_AGENT_KEY": "env"},
        key=credentials.upstream_key,
    )
    assert upstream.api_key == "sk-from-file"
    assert (
        resolve_upstream({"SALVOR_AGENT_UPSTREAM": "http://up", "SALVOR_AGENT_KEY": "env"}).api_key
        == "env"
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda tmp: parse_model_endpoint("ftp://x"),
            "--model-endpoint needs an http:// or https:// URL first, not 'ftp://x'",
        ),
        (
            lambda tmp: parse_model_endpoint("http://x,key=V"),
            "--model-endpoint takes key_env=VAR or key_file=PATH after the URL, not 'key=V'",
        ),
        (
            lambda tmp: parse_model_endpoint("http://x,key_env=A,key_file=B"),
            "--model-endpoint takes one of key_env=VAR or key_file=PATH, not both",
        ),
        (
            lambda tmp: parse_model_endpoint(f"http://x,key_file={tmp}/none"),
            "cannot read the key_file of --model-endpoint '{tmp}/none': No such file or directory",
        ),
        (
            lambda tmp: parse_model_endpoint(f"http://x,key_file={tmp}/empty"),
            "the key_file of --model-endpoint '{tmp}/empty' must hold one key on one line",
        ),
        (
            lambda tmp: parse_mcp_origin("https://tools.example.com/mcp"),
            "--mcp-origin needs an origin such as https://tools.example.com, not 'https://tools.example.com/mcp'",
        ),
        (
            lambda tmp: parse_mcp_origin("https://t,header=X"),
            "--mcp-origin takes header_env=VAR after the origin, not 'header=X'",
        ),
        (
            lambda tmp: Credentials.for_daemon(environ={"SALVOR_AGENT_KEY_FILE": f"{tmp}/none"}),
            "cannot read SALVOR_AGENT_KEY_FILE '{tmp}/none': No such file or directory",
        ),
    ],
)
def test_a_malformed_declaration_is_one_sentence(tmp_path, make, message):
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(CredentialError) as refused:
        make(tmp_path)
    assert str(refused.value) == message.format(tmp=tmp_path)


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        (
            llm(base_url="http://elsewhere"),
            "[llm] base_url 'http://elsewhere' is not a model endpoint",
        ),
        (
            llm(base_url="http://127.0.0.1:notaport"),
            "[llm] base_url 'http://127.0.0.1:notaport' is not a model endpoint",
        ),
        (llm(base_url_env="X"), "[llm] base_url_env makes the daemon read a variable of its own"),
        (
            llm(base_url="http://desk", api_key_env="ANTHROPIC_API_KEY"),
            "[llm] api_key_env 'ANTHROPIC_API_KEY' is not the key",
        ),
        (
            llm("openai", base_url=ANTHROPIC, api_key_env="OPENAI_API_KEY"),
            "[llm] api_key_env 'OPENAI_API_KEY' is not the key",
        ),
    ],
)
def test_what_a_definition_from_http_may_not_name(settings, fragment):
    with pytest.raises(Undeclared) as refused:
        daemon("http://desk,key_env=DESK_KEY").check_llm(**settings)
    assert str(refused.value).startswith(fragment)


@pytest.mark.parametrize(
    "settings",
    [
        llm(),
        llm("openai"),
        llm(base_url="http://desk/v1"),
        llm(base_url="http://desk", api_key_env="DESK_KEY"),
        llm("openai", base_url=ANTHROPIC, api_key_env="ANTHROPIC_API_KEY"),
        llm("demo"),
    ],
)
def test_what_a_definition_from_http_may_name(settings):
    daemon("http://desk,key_env=DESK_KEY").check_llm(**settings)


def test_mcp_origins_and_the_variables_bound_to_them():
    credentials = Credentials(
        mcp_origins=(parse_mcp_origin("https://Tools.example.com:443,header_env=DESK"),)
    )
    credentials.check_mcp_url(
        "web", "https://tools.example.com/mcp", {"Authorization": "Bearer ${DESK}"}, None
    )
    for url, headers, token_env in [
        ("http://tools.example.com/mcp", {}, None),  # another scheme is another origin
        ("https://tools.example.com:8443/mcp", {}, None),
        ("https://tools.example.com/mcp", {"X": "${HOME}"}, None),
        ("https://tools.example.com/mcp", {}, "ANTHROPIC_API_KEY"),
    ]:
        with pytest.raises(Undeclared):
            credentials.check_mcp_url("web", url, headers, token_env)


def test_endpoints_compare_by_what_they_reach():
    assert normalise_endpoint("HTTPS://API.example.com:443/v1/") == normalise_endpoint(
        "https://api.example.com"
    )
    assert normalise_endpoint("http://h/proxy/v1") == normalise_endpoint("http://h/proxy")
    assert normalise_endpoint("http://h/a") != normalise_endpoint("http://h/b")
