"""The OpenAPI document's ``/v1/graphs*``: true of real requests and answers, and of the validator.

* A real daemon (with a bearer token) is driven into every status the document lists for the
  graph paths; each body is validated against the schema documented for its path, method and
  status, and every request body the daemon took against the request's schema
  (``tests.support.contract``). A documented status no request reached fails.
* ``GraphDocument`` names exactly the fields the validator reads, kind by kind, and admits a
  document exactly when the validator reads its fields without a ``malformed_document``:
  documents at the edges of each field's rule, on both sides.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from salvor.protocol import _graph_shape as validator
from salvor.protocol import check_graph

from tests.support.api_server import TOKEN
from tests.support.contract import (
    DOCUMENT,
    GRAPH_PATHS,
    OVERSIZED,
    Contract,
    below_the_free_space_floor,
)
from tests.support.graph_documents import EVERY_KIND_YAML, every_kind, three_defects

GRAPH_DOCUMENT = "/components/schemas/GraphDocument"


async def test_graph_answers_match_the_document(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call
    yaml = {"Content-Type": "application/yaml"}

    created = await call(api, "POST", "/v1/graphs", expect=201, json=every_kind())
    assert created["created"] is True
    again = await call(api, "POST", "/v1/graphs", expect=201, content=EVERY_KIND_YAML, headers=yaml)
    assert again == {"graph": created["graph"], "created": False}
    await call(api, "POST", "/v1/graphs", expect=400, json=three_defects()[0])
    await call(api, "POST", "/v1/graphs", expect=400, content=b"{", headers=yaml)
    await call(
        api, "POST", "/v1/graphs", expect=415, content=b"{}", headers={"Content-Type": "text/csv"}
    )
    await call(api, "GET", "/v1/graphs", expect=200)
    with below_the_free_space_floor(server.state):
        await call(api, "POST", "/v1/graphs", expect=507, json=every_kind())
    read = await call(
        api, "GET", "/v1/graphs/{graph_hash}", expect=200, graph_hash=created["graph"]
    )
    assert read["document"] == every_kind()
    await call(api, "GET", "/v1/graphs/{graph_hash}", expect=404, graph_hash="sha256:" + "0" * 64)

    validate = "/v1/graphs/validate"
    assert (await call(api, "POST", validate, expect=200, json=every_kind()))["valid"] is True
    assert (await call(api, "POST", validate, expect=200, json=three_defects()[0]))[
        "valid"
    ] is False
    assert (await call(api, "POST", validate, expect=200, json=[1, 2]))["valid"] is False
    await call(
        api, "POST", validate, expect=415, content=b"{}", headers={"Content-Type": "text/plain"}
    )
    # An empty body needs no type: it is read as JSON, and is no document.
    assert (await call(api, "POST", validate, expect=200, content=b""))["valid"] is False

    anonymous = server.new_client()
    for template in ("/v1/graphs", validate):
        await call(
            api,
            "POST",
            template,
            expect=413,
            content=OVERSIZED,
            headers={"Content-Type": "application/json"},
        )
        await call(anonymous, "POST", template, expect=401, json=every_kind())
    await call(anonymous, "GET", "/v1/graphs", expect=401)
    await call(anonymous, "GET", "/v1/graphs/{graph_hash}", expect=401, graph_hash="x")

    unreached = {seen for seen in contract.unreached() if seen[0] in GRAPH_PATHS}
    assert not unreached, f"documented but never answered: {sorted(unreached)}"
    assert contract.requests >= {("/v1/graphs", "post"), ("/v1/graphs/validate", "post")}


def _schema(name: str) -> dict:
    return DOCUMENT["components"]["schemas"][name]


def test_the_document_schema_names_exactly_the_fields_the_validator_reads() -> None:
    top = _schema("GraphDocument")
    assert set(top["properties"]) == validator._TOP_FIELDS
    assert set(_schema("GraphEdge")["properties"]) == validator._EDGE_FIELDS
    nodes = {node["properties"]["kind"]["const"]: node for node in _schema("GraphNode")["oneOf"]}
    assert set(nodes) == {kind.value for kind in validator.NodeKind}
    for kind, node in nodes.items():
        fields = validator._KIND_FIELDS[validator.NodeKind(kind)]
        assert set(node["properties"]) == validator._COMMON_FIELDS | fields, kind
        required = set(validator._KIND_REQUIRED[validator.NodeKind(kind)])
        # A map's body is required here; the validator reports its absence with a code of its
        # own (map_without_body), which is still an invalid document.
        assert set(node["required"]) - {"id", "kind", "body"} == required, kind
    bodies = {
        body["properties"]["kind"]["const"]: body for body in _schema("GraphMapBody")["oneOf"]
    }
    assert set(bodies) == {kind.value for kind in validator._BODY_KINDS}
    for kind, body in bodies.items():
        fields = validator._KIND_FIELDS[validator.NodeKind(kind)] - validator._NOT_IN_BODY
        assert set(body["properties"]) == fields | {"kind"}


def _with(node_id: str, **fields: Any) -> dict:
    """The valid document with one node's fields changed (a value of None removes the field)."""
    document = every_kind()
    node = next(node for node in document["nodes"] if node["id"] == node_id)
    for name, value in fields.items():
        if value is None:
            node.pop(name, None)
        else:
            node[name] = value
    return document


EDGE_CASES = [
    # (what, document, whether the validator accepts it)
    ("the document as is", every_kind(), True),
    ("a name of 64 characters", _with("research", name="n" * 64), True),
    ("a name of 65 characters", _with("research", name="n" * 65), False),
    ("a blank name", _with("research", name=" \u001f "), False),
    ("a name that is not a string", _with("research", name=7), False),
    ("a delay of a year", _with("cool_off", seconds=365 * 24 * 3600), True),
    ("a delay of a year and a second", _with("cool_off", seconds=365 * 24 * 3600 + 1), False),
    ("a delay of zero seconds", _with("cool_off", seconds=0), False),
    ("a delay with both fields", _with("cool_off", until="2030-01-01T00:00:00Z"), False),
    ("a delay until a reference", _with("later", until="$input.when"), True),
    ("a map of concurrency 64", _with("each", concurrency=64), True),
    ("a map of concurrency 65", _with("each", concurrency=65), False),
    ("a map body with an id", _with("each", body={"kind": "tool", "tool": "x", "id": "b"}), False),
    ("a map body of a gate", _with("each", body={"kind": "gate", "prompt": "p"}), False),
    ("a branch with no cases", _with("route", cases=[], default=None), False),
    ("a branch naming a case twice", _with("route", cases=["a", "a"], default=None), False),
    ("a branch on a plain string", _with("route", on="approved"), False),
    ("a branch on an escaped string", _with("route", on="$$approved"), False),
    ("a fold of an unknown reducer", _with("tally", reducer="avg"), False),
    ("a fold reading a field", _with("tally", field="minutes.total"), True),
    ("a fold reading an empty path", _with("tally", field="a..b"), False),
    ("an agent of a short hash", _with("research", agent="sha256:abc"), False),
    ("a blank tool name", _with("publish", tool="  "), False),
    ("a blank prompt", _with("approve", prompt="\n"), False),
    ("an approval schema", _with("approve", approval_schema={"type": "object"}), True),
    ("an unknown field", _with("publish", retries=3), False),
    ("an id of 64 characters", _with("later", id="L" + "x" * 63), True),
    ("an id starting with a digit", _with("later", id="9later"), False),
]


@pytest.mark.parametrize(
    ("document", "accepted"),
    [pytest.param(document, accepted, id=what) for what, document, accepted in EDGE_CASES],
)
def test_the_document_schema_admits_what_the_validator_accepts(
    document: dict, accepted: bool
) -> None:
    """Each case changes one field; an id case changes no reference (the node is unreferenced)."""
    contract = Contract()
    errors = check_graph(copy.deepcopy(document))
    assert (not errors) is accepted, errors
    assert contract.admits(GRAPH_DOCUMENT, document) is accepted, contract.errors(
        GRAPH_DOCUMENT, document
    )
