"""The OpenAPI 3.1 document of the control plane, served at ``GET /v1/openapi.json``.

Its ``paths`` are read from the routes themselves: each handler is registered with its own
declaration (``_operation.Operation``: summary, parameters, request body, answers, refusals), and
the document is built from the declarations ``operations_of(app)`` finds in the app's URL map, so
it describes exactly the routes the app has. Around them stands the document without its paths
(``_document_skeleton``): what the declarations reference is defined there, under
``components``, once, its schemas in ``_component_schemas`` and its shared refusals in
``_refusals``, which also checks each refusal a declaration lists against the code table and adds
a session-cookie caller's 403 to every guarded operation. What a daemon's operator declared
(its tools, model endpoints and origins) narrows a copy of it here. Built once per set of routes
and declarations; plain data, no IO.

tests/daemon/api/test_openapi.py checks the document against the OpenAPI 3.1 schema and validates
real responses of a real daemon against it, so a handler that drifts from its declaration fails a
test; ``docs/openapi.json`` is the document a README daemon serves (``python -m
salvor.daemon.api._reference`` writes it).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable

from ..agents import DEFAULT_PROVIDER, DeclaredOrigin, LlmChoice
from ..tools import FILE_TOOLS
from ._document_skeleton import SKELETON, TAGS
from ._operation import Operation
from ._refusals import check_codes, with_forbidden
from ._schema import JSON
from ._schema import ref as _ref
from ._served_origins import NOTHING, dialled


def _paths(operations: Iterable[Operation]) -> JSON:
    """The ``paths`` of the declared operations.

    Raises:
        RuntimeError: two declarations of one path and method, a group no ``TAGS`` entry names,
            or a refusal under the wrong status (``check_codes``).
    """
    tags = {tag["name"] for tag in TAGS}
    paths: JSON = {}
    for operation in operations:
        described = paths.setdefault(operation.path, {})
        if operation.method in described:
            raise RuntimeError(f"{operation.method.upper()} {operation.path} is declared twice")
        if operation.tag not in tags:
            raise RuntimeError(f"{operation.operation_id}: no group {operation.tag!r} in TAGS")
        described[operation.method] = with_forbidden(operation.described())
    check_codes(paths)
    return paths


@functools.cache
def _document(operations: tuple[Operation, ...]) -> JSON:
    return {**SKELETON, "paths": _paths(operations)}


def _llm_variants(choices: tuple[LlmChoice, ...]) -> list[JSON]:
    """What ``Credentials.check_llm`` admits, one ``anyOf`` branch per
    provider and declared endpoint."""
    variants: list[JSON] = [
        {"required": ["provider"], "properties": {"provider": {"const": "demo"}}}
    ]
    for choice in choices:
        required = [] if choice.provider == DEFAULT_PROVIDER else ["provider"]
        if not choice.default:
            required.append("base_url")
        variants.append(
            {
                "required": required,
                "properties": {
                    "provider": {"const": choice.provider},
                    "base_url": {"const": choice.base_url},
                    "api_key_env": {"const": choice.key_env} if choice.key_env else {"not": {}},
                },
            }
        )
    return variants


def _declared_origins(
    schemas: JSON, mcp: tuple[DeclaredOrigin, ...], service: tuple[DeclaredOrigin, ...]
) -> None:
    """An MCP `url` server and a service agent only on a declared origin, naming only the
    variables bound to it; with none declared, no `url` server and no service agent at all."""
    server, agent = schemas["McpServer"], schemas["ServiceAgent"]
    if mcp:
        server["anyOf"] = [{"not": {"required": ["url"]}}, *dialled(mcp, bearer=True)]
    else:
        server["properties"]["url"] = NOTHING
    if service:
        agent["anyOf"] = dialled(service, bearer=False)
    else:
        agent["properties"]["url"] = NOTHING


@functools.cache
def _served(
    operations: tuple[Operation, ...],
    tools: tuple[str, ...] | None,
    process_agents: bool,
    llm_choices: tuple[LlmChoice, ...] | None,
    origins: tuple[tuple[DeclaredOrigin, ...], tuple[DeclaredOrigin, ...]] | None,
    skills: tuple[str, ...] | None = None,
) -> JSON:
    document = copy.deepcopy(_document(operations))
    schemas = document["components"]["schemas"]
    if llm_choices is not None:
        schemas["BuiltinAgent"]["properties"]["llm"]["anyOf"] = _llm_variants(llm_choices)
    if origins is not None:
        _declared_origins(schemas, *origins)
    if tools is not None:
        schemas["ToolName"] = {**schemas["ToolName"], "enum": list(tools)} if tools else {"not": {}}
        # A process agent names file tools only, those the daemon's workspace offers.
        offered = [name for name in tools if name in FILE_TOOLS]
        file_tools = schemas["FileToolName"]
        schemas["FileToolName"] = {**file_tools, "enum": offered} if offered else {"not": {}}
    if skills is not None:
        schemas["SkillName"] = (
            {**schemas["SkillName"], "enum": list(skills)} if skills else {"not": {}}
        )
    if not process_agents:
        schemas["AgentDefinition"] = {
            "description": (
                "An agent as JSON: this daemon accepts built-in agents only over HTTP (process and "
                "service agents need --allow-process-agents)."
            ),
            "allOf": [_ref("BuiltinAgent")],
        }
    return document


def openapi_document(
    operations: Iterable[Operation],
    *,
    tools: Iterable[str] | None = None,
    process_agents: bool = True,
    llm_choices: Iterable[LlmChoice] | None = None,
    mcp_origins: Iterable[DeclaredOrigin] | None = None,
    service_origins: Iterable[DeclaredOrigin] | None = None,
    skills: Iterable[str] | None = None,
) -> JSON:
    """The document of ``operations`` (shared: do not mutate it).

    Args:
        operations: the routes' declarations (``operations_of(app)``), in the order the
            document lists them.
        tools: the names the daemon's tool registry holds, so that a tool
            name the document admits is one registration accepts; None
            leaves them unnamed.
        process_agents: whether the daemon accepts process and service
            agents over HTTP (``--allow-process-agents``).
        llm_choices: the model endpoints the operator declared
            (``Credentials.llm_choices``), so that an ``[llm]`` table the
            document admits is one registration accepts; None leaves
            ``base_url`` and ``api_key_env`` any string.
        mcp_origins, service_origins: the origins the operator declared
            (``Credentials.origins``), so that a ``url`` a definition may dial, and the header
            variables it may name, are the ones registration accepts; None (both) leaves them
            any URL and any variable.
        skills: the names the daemon's skill directories hold, so that a skill the document
            admits is one registration resolves; None leaves them any skill name.

    Raises:
        RuntimeError: declarations that do not make a document (``_paths``).
    """
    operations = tuple(operations)
    declared = None
    if mcp_origins is not None or service_origins is not None:
        declared = (tuple(mcp_origins or ()), tuple(service_origins or ()))
    if all(given is None for given in (tools, skills, llm_choices, declared)) and process_agents:
        return _document(operations)
    return _served(
        operations,
        None if tools is None else tuple(sorted(tools)),
        process_agents,
        None if llm_choices is None else tuple(llm_choices),
        declared,
        None if skills is None else tuple(sorted(skills)),
    )
