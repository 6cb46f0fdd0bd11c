"""``/v1/graphs``: submit a graph document, list the stored graphs, read one back, validate one
without storing it.

A document arrives as JSON (``application/json``, the spec's, and the default when no type is
given) or as YAML (``application/yaml`` or ``text/yaml``, ours). A body that is not a document at
all (not strict JSON, not UTF-8 YAML, YAML that fails to parse) is the same ``invalid_graph`` as
any other invalid document, with one ``malformed_document`` error: the validator's first answer,
not a ``bad_request``. Only a media type that is neither is a ``bad_request``.
"""

from __future__ import annotations

import trio
from quart import request
from quart_trio import QuartTrio
from salvor.protocol import Graph, InvalidGraph, parse_graph_json, parse_graph_yaml
from werkzeug.routing import BaseConverter

from ..web import bad_request, unknown_graph
from ._graph_schemas import (
    GRAPH,
    GRAPH_CREATED,
    GRAPH_INVALID,
    GRAPH_LIST,
    GRAPH_SUMMARY,
    GRAPH_VALID,
)
from ._http import body_bytes
from ._state import ServerState

YAML_TYPES = ("application/yaml", "text/yaml", "application/x-yaml", "text/x-yaml")


class _GraphHashConverter(BaseConverter):
    """A graph hash in a path: any segment but ``validate``, the verb that sits beside them, so
    that ``GET /v1/graphs/validate`` is a 405 naming POST rather than a lookup of a graph."""

    regex = "(?!validate$)[^/]+"


def _parser(mimetype: str):
    """The parser for a body of this media type (lower case, no parameters).

    Raises:
        OperationRefused: bad_request for a media type that is neither JSON nor YAML.
    """
    if mimetype in YAML_TYPES:
        return parse_graph_yaml
    if not mimetype or mimetype == "application/json" or mimetype.endswith("+json"):
        return parse_graph_json
    raise bad_request(
        f"send the graph document as application/json or application/yaml, not {mimetype[:64]}"
    )


async def read_graph() -> Graph:
    """The request's body as a validated graph.

    The parse runs on a worker thread: a document near the body cap takes a noticeable
    fraction of a second to validate, and the other requests must not wait for it.

    Raises:
        OperationRefused: bad_request (a media type that is neither JSON nor YAML),
            request_timeout (408) or payload_too_large (413).
        InvalidGraph: every error the document has.
    """
    parse = _parser(request.mimetype or "")
    data = await body_bytes()
    return await trio.to_thread.run_sync(parse, data)


def add_graph_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime
    app.url_map.converters["graph"] = _GraphHashConverter

    @app.post("/v1/graphs")
    async def submit_graph():
        graph = await read_graph()
        created = await runtime.register_graph(graph)
        return GRAPH_CREATED.respond(201, graph=graph.hash, created=created)

    @app.get("/v1/graphs")
    async def list_graphs():
        stored = await runtime.list_graphs()
        return GRAPH_LIST.respond(
            graphs=[GRAPH_SUMMARY.body(graph=g.graph_hash, **g.summary()) for g in stored]
        )

    @app.get("/v1/graphs/<graph:graph_hash>")
    async def get_graph(graph_hash: str):
        # Any text is looked up: a hash this store never issued is simply not stored here.
        stored = await runtime.find_graph(graph_hash)
        if stored is None:
            raise unknown_graph(graph_hash)
        return GRAPH.respond(graph=stored.graph_hash, document=stored.document)

    @app.post("/v1/graphs/validate")
    async def validate_graph():
        try:
            graph = await read_graph()
        except InvalidGraph as exc:
            return GRAPH_INVALID.respond(valid=False, errors=exc.details["errors"])
        return GRAPH_VALID.respond(valid=True, graph=graph.hash, summary=graph.summary())
