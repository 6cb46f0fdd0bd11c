"""``/v1/graphs*`` over real HTTP, on SQLite and PostgreSQL: submit, list, read back, validate.

Every refusal is the one envelope and leaves the store's graphs exactly as they were; a graph
outlives the daemon that stored it. The answers' shapes against the OpenAPI document are
tests/daemon/api/test_openapi_graphs.py's.
"""

from __future__ import annotations

import hashlib
import json

from salvor.protocol import canonical_json

from tests.support.api import assert_error
from tests.support.api_server import TOKEN, Server
from tests.support.graph_documents import EVERY_KIND_YAML, SUMMARY, every_kind, three_defects

YAML = {"Content-Type": "application/yaml"}


def expected_hash(document: object) -> str:
    """The hash any client can compute: sha256 over the RFC 8785 form of the document."""
    return "sha256:" + hashlib.sha256(canonical_json(document)).hexdigest()


async def stored_graphs(server: Server) -> list[dict]:
    response = await server.client.get("/v1/graphs")
    assert response.status_code == 200, response.text
    return response.json()["graphs"]


async def test_a_graph_is_stored_listed_and_read_back_as_submitted(server: Server) -> None:
    document = every_kind()
    sent = json.dumps(document)
    response = await server.client.post(
        "/v1/graphs", content=sent, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 201, response.text
    assert response.json() == {"graph": expected_hash(document), "created": True}
    digest = response.json()["graph"]

    again = await server.client.post("/v1/graphs", json=document)
    assert again.status_code == 201 and again.json() == {"graph": digest, "created": False}

    assert await stored_graphs(server) == [{"graph": digest, **SUMMARY}]
    read = await server.client.get(f"/v1/graphs/{digest}")
    assert read.status_code == 200
    assert read.json() == {"graph": digest, "document": document}
    # Not only equal: the document comes back with its keys in the order they were sent.
    assert json.dumps(read.json()["document"]) == sent


async def test_yaml_and_json_of_one_document_are_one_graph(server: Server) -> None:
    from_yaml = await server.client.post("/v1/graphs", content=EVERY_KIND_YAML, headers=YAML)
    assert from_yaml.status_code == 201, from_yaml.text
    digest = from_yaml.json()["graph"]
    assert digest == expected_hash(every_kind())
    assert from_yaml.json()["created"] is True
    from_json = await server.client.post("/v1/graphs", json=every_kind())
    assert from_json.json() == {"graph": digest, "created": False}
    as_text_yaml = await server.client.post(
        "/v1/graphs/validate",
        content=EVERY_KIND_YAML.encode(),
        headers={"Content-Type": "text/yaml; charset=utf-8"},
    )
    assert as_text_yaml.json() == {"valid": True, "graph": digest, "summary": SUMMARY}
    # The YAML was parsed into the same document: that is what is stored.
    read = await server.client.get(f"/v1/graphs/{digest}")
    assert read.json()["document"] == every_kind()
    assert len(await stored_graphs(server)) == 1


async def test_an_invalid_document_is_refused_with_every_error_and_nothing_stored(
    server: Server,
) -> None:
    document, codes = three_defects()
    response = await server.client.post("/v1/graphs", json=document)
    error = assert_error(response, 400, "invalid_graph")
    errors = error["details"]["errors"]
    assert {e["code"] for e in errors} == codes and len(errors) == 3
    assert error["message"] == "the graph document has 3 validation error(s)"
    dangling = next(e for e in errors if e["code"] == "dangling_edge")
    assert dangling["edge"] == {"from": "tally", "to": "publsh"}
    assert dangling["suggestion"] == "publish" and dangling["missing"] == "publsh"
    assert next(e for e in errors if e["code"] == "blank_node_name")["node"] == "research"
    assert await stored_graphs(server) == []

    # validate answers the same list, as an answer rather than a refusal.
    checked = await server.client.post("/v1/graphs/validate", json=document)
    assert checked.status_code == 200
    assert checked.json() == {"valid": False, "errors": errors}


NOT_DOCUMENTS = [
    # (body, content type, a fragment of the one malformed_document's message)
    (b"", "application/json", "the graph document"),
    (b"{nodes: [", "application/json", "the graph document"),
    (b'{"schema_version": 1, "schema_version": 1}', "application/json", "schema_version"),
    (b"\xef\xbb\xbf{}", "application/json", "byte-order mark"),
    (b'{"schema_version": 1, "nodes": [], "edges": []}', "application/json", "nodes is empty"),
    (
        b'{"schema_version": 1, "nodes": [{"id": "a"}], "edges": [], "x": 1}',
        "application/json; charset=utf-8",
        "unknown field",
    ),
    (b"schema_version: 1\nnodes: [\n", "application/yaml", "line 3, column 1"),
    (b"a: 1\na: 2\n", "application/yaml", "line 2"),
    (b"when: 2026-01-01\n", "text/yaml", "timestamp"),
    (b"n: 9007199254740993\n", "application/yaml", "2**53"),
    (b'text: "nul \\0 here"\n', "application/yaml", "NUL"),
    (b"\xff\xfe not utf-8", "application/yaml", "UTF-8"),
]


async def test_a_body_that_is_no_document_is_one_malformed_document(server: Server) -> None:
    for body, media, fragment in NOT_DOCUMENTS:
        headers = {"Content-Type": media} if media else {}
        response = await server.client.post("/v1/graphs", content=body, headers=headers)
        error = assert_error(response, 400, "invalid_graph")
        (only,) = error["details"]["errors"]
        assert only["code"] == "malformed_document", (body, only)
        assert fragment in only["message"], (body, only["message"])
        checked = await server.client.post("/v1/graphs/validate", content=body, headers=headers)
        assert checked.status_code == 200
        assert checked.json() == {"valid": False, "errors": [only]}
    assert await stored_graphs(server) == []


async def test_validate_never_stores(server: Server) -> None:
    response = await server.client.post("/v1/graphs/validate", json=every_kind())
    assert response.status_code == 200
    assert response.json() == {
        "valid": True,
        "graph": expected_hash(every_kind()),
        "summary": SUMMARY,
    }
    assert await stored_graphs(server) == []
    missing = await server.client.get(f"/v1/graphs/{response.json()['graph']}")
    assert_error(missing, 404, "unknown_graph")


async def test_a_graph_survives_a_restart_of_the_daemon(server_factory) -> None:
    first = await server_factory()
    response = await first.client.post("/v1/graphs", content=EVERY_KIND_YAML, headers=YAML)
    digest = response.json()["graph"]
    await first.stop()
    second = await server_factory()
    assert await stored_graphs(second) == [{"graph": digest, **SUMMARY}]
    read = await second.client.get(f"/v1/graphs/{digest}")
    assert read.json() == {"graph": digest, "document": every_kind()}
    again = await second.client.post("/v1/graphs", json=every_kind())
    assert again.json() == {"graph": digest, "created": False}


async def test_every_graph_route_needs_the_bearer_token(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    anonymous = server.new_client()
    digest = expected_hash(every_kind())
    for method, path in (
        ("POST", "/v1/graphs"),
        ("GET", "/v1/graphs"),
        ("GET", f"/v1/graphs/{digest}"),
        ("POST", "/v1/graphs/validate"),
    ):
        kwargs = {"json": every_kind()} if method == "POST" else {}
        response = await anonymous.request(method, path, **kwargs)
        assert_error(response, 401, "unauthorized")
    assert await stored_graphs(server) == []
    assert (await server.client.post("/v1/graphs", json=every_kind())).status_code == 201


async def test_what_is_not_a_document_question_is_refused_as_http_would(server: Server) -> None:
    """A media type that is neither JSON nor YAML, a hash nothing is stored under (or no hash at
    all: any text is looked up), and validate taken for a hash; none stores anything."""
    for path in ("/v1/graphs", "/v1/graphs/validate"):
        response = await server.client.post(
            path, content=json.dumps(every_kind()), headers={"Content-Type": "text/plain"}
        )
        error = assert_error(response, 415, "unsupported_media_type")
        assert "application/json or application/yaml" in error["message"]
        # Nor is one sent without a type (as a page of another site can), though it is JSON.
        response = await server.client.post(path, content=json.dumps(every_kind()))
        assert_error(response, 415, "unsupported_media_type")

    for text in ("sha256:" + "0" * 64, "nothing-like-a-hash", "sha256:" + "x" * 300):
        error = assert_error(await server.client.get(f"/v1/graphs/{text}"), 404, "unknown_graph")
        assert text[:64] in error["message"] and len(error["message"]) < 200

    response = await server.client.get("/v1/graphs/validate")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["Allow"] == "POST"
    options = await server.client.options("/v1/graphs/validate")
    assert "GET" not in options.headers["Allow"] and "POST" in options.headers["Allow"]
    # A hash that merely starts with the word is looked up like any other.
    assert_error(await server.client.get("/v1/graphs/validated"), 404, "unknown_graph")
    assert_error(await server.client.delete("/v1/graphs"), 405, "method_not_allowed")
    assert await stored_graphs(server) == []
