"""The OpenAPI document: valid OpenAPI 3.1, complete, and built from the declarations the code runs.

* ``openapi-spec-validator`` accepts the document as OpenAPI 3.1.
* Every route the app registers is documented, and nothing else is.
* The code -> status table, the answers' declarations and the served tables (the ``[llm]``
  table, service and MCP urls) are the ones the daemon applies.

Real answers against the document: ``test_openapi_responses.py``; request bodies and the fields
each handler takes: ``test_openapi_requests.py``.
"""

from __future__ import annotations

import json
import re

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from openapi_spec_validator.validation import OpenAPIV31SpecValidator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from salvor.daemon.agents._credentials import (
    Credentials,
    DeclaredEndpoint,
    DeclaredOrigin,
    Undeclared,
)
from salvor.daemon.api import _refusals
from salvor.daemon.api._answers import ANSWERS, RELEASED, RUN_STARTED
from salvor.daemon.api._app import API_OPERATIONS, create_app
from salvor.daemon.api._component_schemas import run_summary
from salvor.daemon.api._openapi import openapi_document
from salvor.daemon.api._operation import operations_of
from salvor.daemon.client_runs import CLIENT_RUN_ANSWERS
from salvor.daemon.client_runs._answers import CLIENT_TOOL_OPENED, COMPLETED
from salvor.daemon.web import is_http_url
from salvor.protocol import STATUS_DETAIL, WIRE_SCHEMAS, RunState
from salvor.store import SUMMARY_KEYS

from tests.support.backends import SQLITE_ONLY
from tests.support.contract import (
    BASE,
    DOCUMENT,
    MISSING_RUN,
)

# SQLite alone (tests/support/backends.py): what it tests is the document against the answers,
# which the handlers build the same way over either backend (tests/daemon/api/test_api keeps both).
STORE_BACKENDS = SQLITE_ONLY


def test_document_is_valid_openapi_3_1() -> None:
    validate(DOCUMENT, cls=OpenAPIV31SpecValidator)
    assert DOCUMENT["openapi"].startswith("3.1.")


def test_served_llm_table_is_what_registration_accepts() -> None:
    """The served `[llm]` schema admits a table exactly when ``check_llm`` does (issue 12: the
    declared endpoints and their bound key variables, no `base_url_env`)."""
    credentials = Credentials(
        endpoints=(
            DeclaredEndpoint(base_url="http://10.0.0.5:8000/v1", key_env="LOCAL_KEY"),
            DeclaredEndpoint(base_url="http://10.0.0.6:8000"),
        ),
        environ={"SALVOR_MODEL_BASE_URL": "https://gateway.example.com"},
        strict=True,
    )
    served = openapi_document(
        API_OPERATIONS, process_agents=False, llm_choices=credentials.llm_choices()
    )
    validate(served, cls=OpenAPIV31SpecValidator)
    registry = Registry().with_resource(
        BASE, Resource.from_contents(served, default_specification=DRAFT202012)
    )
    schema = Draft202012Validator(
        {"$ref": f"{BASE}#/components/schemas/BuiltinAgent"}, registry=registry
    )
    urls = [
        None,
        "http://10.0.0.5:8000/v1",
        "http://10.0.0.6:8000",
        "https://gateway.example.com",
        "https://api.openai.com",
        "http://127.0.0.1:9999/x",
    ]
    keys = [None, "LOCAL_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "SALVOR_AGENT_KEY"]
    admitted = 0
    for provider in (None, "anthropic", "openai", "demo"):
        for url in urls:
            for key in keys:
                llm = {
                    name: value
                    for name, value in (
                        ("provider", provider),
                        ("base_url", url),
                        ("api_key_env", key),
                    )
                    if value is not None
                }
                try:
                    credentials.check_llm(
                        provider=provider or "anthropic",
                        base_url=url,
                        base_url_env=None,
                        api_key_env=key,
                    )
                    accepted = True
                except Undeclared:
                    accepted = False
                assert schema.is_valid({"model": "m", "llm": llm}) is accepted, llm
                admitted += accepted
    assert 0 < admitted < 4 * len(urls) * len(keys)
    assert not schema.is_valid({"model": "m", "llm": {"provider": "demo", "base_url_env": "HOME"}})


def test_served_service_and_mcp_urls_are_what_registration_accepts() -> None:
    """A service agent's trigger and an MCP `url` server: the served document admits a url and
    its header variables exactly when ``check_service`` / ``check_mcp_url`` do (the declared
    origins, each with the variables bound to it); with none declared, neither at all."""
    declared = (
        DeclaredOrigin(origin="http://127.0.0.1:9000", header_envs=frozenset({"SVC_TOKEN"})),
        DeclaredOrigin(origin="https://tools.example.com:443"),
    )
    urls = [
        "http://127.0.0.1:9000/task",
        "HTTP://127.0.0.1:9000",
        "http://127.0.0.1:9001/task",
        "https://tools.example.com/mcp",
        "https://TOOLS.example.com:443/mcp?x=1",
        "https://tools.example.com:8443/mcp",
        "http://tools.example.com/mcp",
    ]
    values = [None, "Bearer ${SVC_TOKEN}", "${HOME}", "$5 flat", "$${SVC_TOKEN}"]
    for credentials in (
        Credentials(service_origins=declared, mcp_origins=declared, strict=True),
        Credentials(strict=True),
    ):
        served = openapi_document(
            API_OPERATIONS,
            mcp_origins=credentials.origins("mcp"),
            service_origins=credentials.origins("service"),
        )
        registry = Registry().with_resource(
            BASE, Resource.from_contents(served, default_specification=DRAFT202012)
        )

        service, server = (
            Draft202012Validator({"$ref": f"{BASE}#/components/schemas/{name}"}, registry=registry)
            for name in ("ServiceAgent", "McpServer")
        )
        admitted = 0
        for url in urls:
            for value in values:
                headers = {} if value is None else {"X-Key": value}
                try:
                    credentials.check_service(url, headers)
                    accepted = True
                except Undeclared:
                    accepted = False
                agent = {"kind": "service", "url": url, "proxy_port": 9100, "headers": headers}
                assert service.is_valid(agent) is accepted, (url, value)
                try:
                    credentials.check_mcp_url("s", url, headers, None)
                    accepted = True
                except Undeclared:
                    accepted = False
                assert server.is_valid({"name": "s", "url": url, "headers": headers}) is accepted, (
                    url,
                    value,
                )
                admitted += accepted
        assert (admitted > 0) is bool(credentials.origins("mcp"))
        assert server.is_valid({"name": "s", "command": "mcp-server-time"})


async def test_every_route_is_documented(server) -> None:
    """The document's paths are the app's routes: read from the declarations its URL map holds,
    each registered once, and the same as the route modules' tables (``API_OPERATIONS``, the
    document without an app): a declaration no handler registers is missing from the URL map."""
    app = create_app(server.state)  # a second app over the same state: only its routes are read
    served = {
        (re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        # The page (/, /ui/<name>) and the reference (/docs) are not API: the document describes
        # /v1 and /metrics.
        if rule.rule.startswith("/v1/") or rule.rule == "/metrics"
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    documented = {
        (path, method) for path, operations in DOCUMENT["paths"].items() for method in operations
    }
    assert served == documented
    declared = operations_of(app)
    assert len(set(declared)) == len(declared)
    assert set(declared) == set(API_OPERATIONS), "a module's OPERATIONS and its handlers differ"
    assert {(o.path, o.method) for o in declared} == served


async def test_a_route_without_a_declaration_stops_the_document(server) -> None:
    """A handler registered the plain Quart way under /v1 has no declaration: the document (and
    so ``create_app``, which builds it) refuses, naming the route; the page's routes need none."""
    app = create_app(server.state)

    @app.get("/v1/undeclared/<run_id>")
    async def undeclared(run_id: str):
        return ""

    with pytest.raises(RuntimeError, match=r"without a declaration .*GET /v1/undeclared/<run_id>"):
        operations_of(app)


def test_every_refusal_is_listed_under_the_status_its_code_answers_with(monkeypatch) -> None:
    """The document is checked against the code -> status table when it is built; a code the table
    gives another status than the one the document lists it under stops the build, naming it."""
    _refusals.check_codes(DOCUMENT["paths"])
    # The table itself is read-only: the check is pointed at a copy that disagrees once.
    monkeypatch.setattr(_refusals, "CODE_STATUS", {**_refusals.CODE_STATUS, "lease_held": 423})
    with pytest.raises(RuntimeError, match=r"POST /v1/client-runs 409: lease_held"):
        _refusals.check_codes(DOCUMENT["paths"])


async def test_an_answer_is_built_with_the_fields_its_declaration_has() -> None:
    """A handler's answer and the document's schema for it are one declaration; an answer built with
    a field it lacks, or without a required one, is a bug that raises (the client gets the 500)."""
    response = RUN_STARTED.respond(201, run=MISSING_RUN, status="running", replay_of=None)
    assert response.status_code == 201
    assert json.loads(await response.get_data()) == {"run": MISSING_RUN, "status": "running"}
    with pytest.raises(RuntimeError, match="the Released answer was built with"):
        RELEASED.respond(released=True, lease="dt_x")
    with pytest.raises(RuntimeError, match="needs"):
        RUN_STARTED.respond(201, run=MISSING_RUN)
    for answer in ANSWERS:
        assert DOCUMENT["components"]["schemas"][answer.name] == answer.schema()


def test_the_document_describes_what_the_builders_build_from_their_own_declarations() -> None:
    """Every domain shape under ``components`` is its builder's declaration, not a copy of it: the
    core's (status, pending, envelope, replay, usage), the client-run answers, a run summary's
    keys. The document names exactly those and no hand-written twin shadows one."""
    schemas = DOCUMENT["components"]["schemas"]
    for name, schema in WIRE_SCHEMAS.items():
        assert schemas[name] == schema, name
    for shape in CLIENT_RUN_ANSWERS:
        assert schemas[shape.name] == shape.schema(), shape.name
    assert set(schemas["RunSummary"]["properties"]) == SUMMARY_KEYS | {"driver", "driver_node"}
    # A key the store's summary gains stops the document's build until it is described there.
    with pytest.raises(RuntimeError, match=r"a run summary .*but the code uses .*'parent_run'"):
        run_summary(SUMMARY_KEYS | {"parent_run"})


def test_every_run_state_has_a_status_variant_in_the_served_document() -> None:
    """The served ``Status`` has one variant per ``RunState``, made from the fold's own table: the
    state, and the fields of the event that enters it (``STATUS_DETAIL``)."""
    variants = {
        variant["properties"]["state"]["const"]: variant
        for variant in DOCUMENT["components"]["schemas"]["Status"]["oneOf"]
    }
    assert set(variants) == {state.value for state in RunState}
    for state in RunState:
        detail = STATUS_DETAIL.get(state)
        fields = set(detail._field_names()) if detail else set()
        extra = {"overdue", "overdue_seconds"} if state is RunState.SLEEPING else set()
        assert set(variants[state.value]["properties"]) == {"state"} | fields | extra, state


def test_a_client_run_answer_built_with_a_field_its_shape_lacks_raises() -> None:
    """The client-run builders answer through their shape; one that writes a field the document
    does not describe, or drops a required one, is a bug that raises (the client gets the 500)."""
    key = "sha256:" + "0" * 64
    assert COMPLETED.build(seq=3, completed=True) == {"seq": 3, "completed": True}
    with pytest.raises(RuntimeError, match="the Completed answer was built with"):
        COMPLETED.build(seq=3, completed=True, at="now")
    with pytest.raises(RuntimeError, match="needs"):
        CLIENT_TOOL_OPENED.build(seq=3, idempotency_key=key, settled=False)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/trigger",
        "HTTPS://u:p@host:65535/x?y#z",
        "http://host:0",
        "http://host:65536",
        "http://a[b@host",
        "http://a]b@host",
        "ftp://host",
        "http://",
        "http://ho st",
        # Found by the fuzz: a bracket in the user part, which urlsplit refuses.
        "htTP://\U000bcdea%©ß[Jh÷nê,@6ÀĄččéeù\x86ä\x87Ⱥ#昛ê",
    ],
)
def test_a_service_url_the_document_admits_is_one_the_daemon_takes(url: str) -> None:
    pattern = DOCUMENT["components"]["schemas"]["ServiceAgent"]["properties"]["url"]["pattern"]
    assert bool(re.search(pattern, url)) is is_http_url(url)
