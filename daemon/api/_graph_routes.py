"""``/v1/graphs``: submit a graph document (and keep it by name, with ``?name=NAMESPACE/NAME``),
list the stored graphs, read one back, validate one without storing it.

A document arrives as JSON (``application/json``, the spec's) or as YAML (``application/yaml`` or
``text/yaml``, ours). A body that is not a document at all (not strict JSON, not UTF-8 YAML, YAML
that fails to parse) is the same ``invalid_graph`` as any other invalid document, with one
``malformed_document`` error: the validator's first answer, not a ``bad_request``. A body sent as
neither type, or with none (what a page of another site can send), is 415
``unsupported_media_type``.
"""

from __future__ import annotations

from quart import request
from quart_trio import QuartTrio
from salvor.protocol import Graph, InvalidGraph, excerpt, parse_graph_json, parse_graph_yaml
from werkzeug.routing import BaseConverter

from ..runs import flow_name_parts
from ..web import bad_request, is_json_media, off_loop, unknown_graph, unsupported_media_type
from ._graph_schemas import (
    GRAPH,
    GRAPH_CREATED,
    GRAPH_INVALID,
    GRAPH_LIST,
    GRAPH_SUMMARY,
    GRAPH_VALID,
)
from ._http import body_bytes
from ._operation import Operation, error, error_schema, parameter, route
from ._schema import ref
from ._state import ServerState

YAML_TYPES = ("application/yaml", "text/yaml", "application/x-yaml", "text/x-yaml")


class _GraphHashConverter(BaseConverter):
    """A graph hash in a path: any segment but ``validate``, the verb that sits beside them, so
    that ``GET /v1/graphs/validate`` is a 405 naming POST rather than a lookup of a graph."""

    regex = "(?!validate$)[^/]+"


def _parser(mimetype: str, data: bytes):
    """The parser for a body of this media type (lower case, no parameters); an empty body needs
    none, and reads as JSON (so ``validate`` answers it invalid).

    Raises:
        OperationRefused: unsupported_media_type (415) for a body sent as neither JSON nor YAML,
            or as nothing at all.
    """
    if mimetype in YAML_TYPES:
        return parse_graph_yaml
    if is_json_media(mimetype) or not (mimetype or data.strip()):
        return parse_graph_json
    sent = f"not {excerpt(mimetype)}" if mimetype else "not without a Content-Type"
    raise unsupported_media_type(
        f"send the graph document as application/json or application/yaml, {sent}"
    )


async def read_graph() -> Graph:
    """The request's body as a validated graph.

    The parse runs on an untrusted-work thread (``web.off_loop``): a document near the body cap
    takes seconds to validate (its YAML events, its nodes and its gates' schemas are bounded),
    and the other requests must not wait for it.

    Raises:
        OperationRefused: unsupported_media_type (a media type that is neither JSON nor YAML),
            request_timeout (408) or payload_too_large (413).
        InvalidGraph: every error the document has.
    """
    data = await body_bytes()
    parse = _parser(request.mimetype or "", data)
    return await off_loop(parse, data)


def _flow_named() -> tuple[str, str] | None:
    """``(namespace, name)`` of the submit's ``?name=``, None without one.

    Raises:
        OperationRefused: bad_request for another query parameter or a name that is not
            ``namespace/name``; nothing is stored.
    """
    unknown = sorted(set(request.args) - {"name"})
    if unknown:
        raise bad_request(
            f"POST /v1/graphs takes the query parameter `name` only, not {excerpt(unknown[0])!r}"
        )
    given = request.args.getlist("name")
    if not given:
        return None
    if len(given) > 1:
        raise bad_request("give `name` once")
    return flow_name_parts(given[0])


# A YAML body is described by the JSON value it parses to: YAML is another spelling of the same
# document, read with JSON's values only (no timestamps, sets, binary, non-string or duplicate
# keys), and it hashes as that JSON does.
_DOCUMENT_TYPES = ("application/json", "application/yaml", "text/yaml")

SUBMIT = Operation(
    method="post",
    rule="/v1/graphs",
    operation_id="submitGraph",
    new_work=True,
    tag="graphs",
    summary="Submit a graph document: validated whole, stored content-addressed",
    body={
        "required": True,
        "content": {media: {"schema": ref("GraphDocument")} for media in _DOCUMENT_TYPES},
    },
    answers={
        "201": (
            "Stored; `created` is false when the identical document already was.",
            GRAPH_CREATED,
        )
    },
    parameters=(
        {
            "name": "name",
            "in": "query",
            "schema": ref("FlowName"),
            "description": "Keep the graph as the flow `namespace/name` too: its next version "
            "when the name's current version has another graph (the earlier versions are kept "
            "for the runs already started on them), none when it has this one.",
        },
    ),
    refusals=("PayloadTooLarge",),
    responses={
        "400": error(
            "`invalid_graph` with every error in `details.errors` (a body that is not a document "
            "at all is one `malformed_document`), or `bad_request` for a `name` that is not "
            "`namespace/name` or another query parameter. Nothing stored.",
            schema={
                "oneOf": [ref("InvalidGraphError"), error_schema(["bad_request"])],
            },
        )
    },
)
LIST = Operation(
    method="get",
    rule="/v1/graphs",
    operation_id="listGraphs",
    tag="graphs",
    summary="List the stored graphs with their shape, oldest first",
    answers={"200": ("The graphs.", GRAPH_LIST)},
)
VALIDATE = Operation(
    method="post",
    rule="/v1/graphs/validate",
    operation_id="validateGraph",
    tag="graphs",
    summary="Validate a graph document without storing it",
    # It answers whatever it is sent, an empty body too (`valid: false`).
    body={
        "required": False,
        "content": {
            media: {
                "schema": {
                    "description": "Any value: whatever it is, the answer says whether it is a "
                    "valid graph document."
                }
            }
            for media in _DOCUMENT_TYPES
        },
    },
    answers={
        "200": (
            "The answer, valid or not (with every error); nothing is stored.",
            {"oneOf": [ref(GRAPH_VALID.name), ref(GRAPH_INVALID.name)]},
        )
    },
    refusals=("PayloadTooLarge",),
)
READ = Operation(
    method="get",
    rule="/v1/graphs/<graph:graph_hash>",
    operation_id="getGraph",
    tag="graphs",
    summary="Read one stored graph document back, as submitted",
    parameters=(parameter("GraphHash"),),
    answers={"200": ("The document.", GRAPH)},
    responses={"404": error("No graph stored under that hash.", "unknown_graph")},
)
OPERATIONS = (SUBMIT, LIST, READ, VALIDATE)


def add_graph_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime
    app.url_map.converters["graph"] = _GraphHashConverter

    names = runtime.definitions.flow_names

    @route(app, SUBMIT)
    async def submit_graph():
        flow = _flow_named()
        graph = await read_graph()
        created = await runtime.definitions.register_graph(graph)
        if flow is None:
            return GRAPH_CREATED.respond(201, graph=graph.hash, created=created)
        naming = await names.name(*flow, graph.hash, run_id=None)
        return GRAPH_CREATED.respond(
            201,
            graph=graph.hash,
            created=created,
            flow="/".join(flow),
            version=naming.version,
            new_version=naming.created,
        )

    @route(app, LIST)
    async def list_graphs():
        stored = await runtime.definitions.list_graphs()
        return GRAPH_LIST.respond(
            graphs=[GRAPH_SUMMARY.body(graph=g.graph_hash, **g.summary()) for g in stored]
        )

    @route(app, READ)
    async def get_graph(graph_hash: str):
        # Any text is looked up: a hash this store never issued is simply not stored here.
        stored = await runtime.definitions.find_graph(graph_hash)
        if stored is None:
            raise unknown_graph(graph_hash)
        return GRAPH.respond(graph=stored.graph_hash, document=stored.document)

    @route(app, VALIDATE)
    async def validate_graph():
        try:
            graph = await read_graph()
        except InvalidGraph as exc:
            return GRAPH_INVALID.respond(valid=False, errors=exc.details["errors"])
        return GRAPH_VALID.respond(valid=True, graph=graph.hash, summary=graph.summary())
