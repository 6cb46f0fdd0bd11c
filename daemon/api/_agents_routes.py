"""``/v1/agents``: register a definition, list the stored agents, read one back."""

from __future__ import annotations

import functools

from quart import request
from quart_trio import QuartTrio

from ..agents import MAX_DEFINITION_BYTES, DefinitionError, parse_definition
from ..web import bad_request, is_json_media, off_loop, unknown_agent, unsupported_media_type
from ._answers import AGENT, AGENT_CREATED, AGENT_LIST, AGENT_SUMMARY
from ._http import body_bytes
from ._operation import Operation, error, parameter, route
from ._state import ServerState

_TOML = ("application/toml", "text/toml", "application/x-toml")
# A markdown agent file: front matter, then the system prompt.
MARKDOWN = ("text/markdown", "text/x-markdown")

REGISTER = Operation(
    method="post",
    rule="/v1/agents",
    operation_id="registerAgent",
    new_work=True,
    tag="agents",
    summary="Register an agent definition (validated, stored, content-addressed)",
    description=(
        "The agent is built first: each MCP server it declares is started or reached, lists its "
        "tools and is closed again. A definition that will not build is a 400 naming the server "
        "and why, and nothing is stored."
    ),
    body={
        "required": True,
        "content": {
            "application/toml": {"schema": {"type": "string"}},
            "application/json": {"schema": {"$ref": "#/components/schemas/AgentDefinition"}},
            "text/markdown": {
                "schema": {
                    "type": "string",
                    "description": (
                        "A markdown agent file: YAML front matter between `---` lines (`name`, "
                        "`model`, `description`, `tools` — flow tools and registry tools alike —, "
                        "`inputs`, `outputs`, and the built-in agent's `llm`, `budgets`, "
                        "`pricing`, `max_response_tokens`, `record_prompts`, `mcp_servers`; `card` "
                        "and `architect` are display metadata), the body its system prompt. It "
                        "hashes as the TOML definition of the same fields."
                    ),
                }
            },
        },
    },
    answers={"201": ("Registered; `created` is false when it already was.", AGENT_CREATED)},
    refusals=("BadRequest", "PayloadTooLarge"),
)
LIST = Operation(
    method="get",
    rule="/v1/agents",
    operation_id="listAgents",
    tag="agents",
    summary="List the registered agents",
    answers={"200": ("The agents; `name` only when the definition has one.", AGENT_LIST)},
)
READ = Operation(
    method="get",
    rule="/v1/agents/<agent_hash>",
    operation_id="getAgent",
    tag="agents",
    summary="Read one registered definition back",
    parameters=(parameter("AgentHash"),),
    answers={"200": ("The definition, verbatim.", AGENT)},
    responses={"404": error("No agent under that hash.", "unknown_agent")},
)
OPERATIONS = (REGISTER, LIST, READ)


async def _posted_definition() -> tuple[str, str]:
    """The definition this request posts, and its format (by its content type).

    Raises:
        OperationRefused: 415 for another content type, 400 for a body that is not UTF-8
            text, 413 past the definition's limit.
    """
    mimetype = request.mimetype or ""
    if mimetype in _TOML:
        fmt = "toml"
    elif is_json_media(mimetype):
        fmt = "json"
    elif mimetype in MARKDOWN:
        fmt = "md"
    else:
        raise unsupported_media_type(
            "send the definition as application/toml, application/json or text/markdown"
        )
    data = await body_bytes(MAX_DEFINITION_BYTES, "an agent definition")
    try:
        return data.decode("utf-8"), fmt
    except UnicodeDecodeError:
        raise bad_request("the definition is not UTF-8 text") from None


def add_agent_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, REGISTER)
    async def register_agent():
        text, fmt = await _posted_definition()
        try:
            # Bounded, but a near-limit definition still takes a good fraction of a second.
            agent = await off_loop(
                functools.partial(
                    parse_definition,
                    text,
                    fmt,
                    known_tools=runtime.kit.registry.names(),
                    skills=runtime.kit.registry.skills,
                    allow_paths=False,
                    allow_processes=state.allow_process_agents,
                    credentials=state.credentials,
                )
            )
        except DefinitionError as exc:
            raise bad_request(f"the agent definition does not build: {exc}") from None
        await runtime.definitions.build_agent(agent)
        created = await runtime.definitions.register_agent(agent)
        return AGENT_CREATED.respond(201, agent=agent.agent_def_hash, created=created)

    @route(app, LIST)
    async def list_agents():
        stored = await runtime.definitions.list_agents()
        return AGENT_LIST.respond(
            agents=[AGENT_SUMMARY.body(agent=a.agent_def_hash, name=a.name or None) for a in stored]
        )

    @route(app, READ)
    async def get_agent(agent_hash: str):
        stored = await runtime.definitions.find_agent(agent_hash)
        if stored is None:
            raise unknown_agent(agent_hash)
        try:
            parsed = await off_loop(
                functools.partial(
                    parse_definition,
                    stored.definition,
                    stored.format,
                    known_tools=runtime.kit.registry.names(),
                    stored=True,
                )
            )
            kind = parsed.kind.value
        except DefinitionError:
            kind = None  # stored under another daemon's tools: its text is still the answer
        return AGENT.respond(
            agent=stored.agent_def_hash,
            format=stored.format,
            definition=stored.definition,
            name=stored.name or None,
            kind=kind,
        )
