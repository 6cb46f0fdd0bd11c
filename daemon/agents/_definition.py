"""Agent definitions: TOML, JSON or markdown files that are pure data.

A definition is validated strictly (an unknown field is a loud error, not a
silently dropped budget) and identified by ``agent_def_hash``: sha256 over the
canonical JSON of the normalised definition, with the display ``name`` left
out so renaming an agent never mints a new identity. A field the text does not
give is absent from the normalised definition, so a field this module gains
never changes the hash of a definition written before it.

This module reads a definition and hands it to its kind's parser: a built-in agent's
(``_builtin_definition``, its ``[llm]`` in ``_llm_table``), or a process or service agent's
(``_outside_definition``); the rules every field is held to are ``_definition_rules``, and what
the operator must allow first ``_definition_reach``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from salvor.protocol import BUDGET_KINDS, MalformedJson, check_document

from ..skills import SkillLibrary
from ._agent_definition import KINDS, AgentDefinition, AgentKind
from ._builtin_definition import (
    BUILTIN_FIELDS,
    PRICING_FIELDS,
    TOOL_FIELDS,
    builtin_agent,
    builtin_refusals,
)
from ._credentials import Credentials
from ._definition_error import DefinitionError
from ._definition_reach import reached, require_opt_in
from ._definition_rules import expect
from ._definition_text import MAX_DEFINITION_BYTES, format_of, read_document
from ._llm_table import LLM_FIELDS
from ._markdown import read_markdown_refusals
from ._outside_definition import PROCESS_FIELDS, SERVICE_FIELDS, process_agent, service_agent

# The value and the error a parse gives are offered here too, beside the parsers (the loop and
# the tests take them from this module).
__all__ = [
    "HTTP_FIELDS",
    "AgentDefinition",
    "AgentKind",
    "DefinitionError",
    "definition_refusals",
    "load_definition",
    "parse_definition",
]

# The fields each table of a definition takes over HTTP, by table: what the OpenAPI document
# describes (``api._openapi`` refuses to build when its schemas name other fields). A file on the
# daemon's disk may also give `system_prompt_path` and `[llm] base_url_env`; HTTP refuses both.
HTTP_FIELDS: dict[str, frozenset[str]] = {
    "builtin": frozenset(BUILTIN_FIELDS - {"kind", "system_prompt_path"}),
    "llm": frozenset(LLM_FIELDS - {"base_url_env"}),
    "budgets": frozenset(BUDGET_KINDS),
    "pricing": frozenset(PRICING_FIELDS),
    "tools": frozenset(TOOL_FIELDS),
    "process": frozenset(PROCESS_FIELDS),
    "service": frozenset(SERVICE_FIELDS),
}


def parse_definition(
    text: str,
    fmt: str,
    *,
    base_dir: Path | None = None,
    known_tools=(),
    allow_paths: bool = True,
    allow_processes: bool = True,
    credentials: Credentials | None = None,
    stored: bool = False,
    read_prompt: Callable[[str], str] | None = None,
    skills: SkillLibrary | None = None,
) -> AgentDefinition:
    """Parse and validate a definition from its text.

    Args:
        text: the file's contents.
        fmt: ``"toml"``, ``"json"`` or ``"md"`` (a markdown agent file: YAML front matter, the body
            its system prompt; it stands for the TOML definition of the same fields, and hashes as
            that one does).
        base_dir: where ``system_prompt_path`` is resolved from.
        known_tools: names the daemon's tool registry holds, the file tools its workspace offers
            among them (``ToolRegistry.names``).
        allow_paths: whether ``system_prompt_path`` may name a file. A definition that arrives over
            the network must not make the daemon read its own files, so the HTTP API passes False.
        allow_processes: whether a ``kind = "process"`` definition (a command the daemon will run)
            or a ``kind = "service"`` one (a port it binds, a URL it POSTs to) is accepted, and
            likewise an MCP server the daemon spawns (``command``) or one whose headers read the
            daemon's environment. Over HTTP only when the operator started the daemon with
            ``--allow-process-agents``.
        credentials: the operator's declarations a definition from HTTP is held to
            (``Credentials.check_reach``, one rule for every kind): its ``[llm]`` names a declared
            model endpoint (never a variable), a service agent's ``url`` a declared service origin,
            each MCP ``url`` server a declared MCP origin, and headers only the variables bound to
            those origins. None for an agent file the operator runs.
        read_prompt: gives the text of ``system_prompt_path`` as written, instead of reading it from
            ``base_dir`` (a flow's agent file, whose prompt came with it); raises DefinitionError
            when it has none.
        stored: the daemon's own stored copy (``Definitions.load_agent``), read by the rules it was
            accepted under: integers beyond 2**53 (and, in TOML, a ``\\u0000``) that a new
            definition is refused for, and file tools a daemon without a workspace (or the shell)
            does not offer, so the runs recorded against it still resume, under the same hash.
        skills: the daemon's skill directories, which every name in ``skills`` must resolve in
            (None: the names are not looked up, as for a stored copy or a check made away from
            the daemon).

    Raises:
        DefinitionError: with one sentence naming what is wrong, and ``at`` the field it is
            about.
    """
    raw, markdown = read_document(text, fmt, stored)
    if "kind" in raw:
        return reached(
            _outside_kind(raw, fmt, text, allow_processes, known_tools, stored, skills),
            credentials,
        )
    agent = builtin_agent(
        raw,
        fmt,
        text,
        markdown,
        base_dir=base_dir,
        known_tools=known_tools,
        allow_paths=allow_paths,
        allow_processes=allow_processes,
        credentials=credentials,
        read_prompt=read_prompt,
        stored=stored,
        library=skills,
    )
    return reached(agent, credentials)


def definition_refusals(
    text: str,
    fmt: str,
    *,
    known_tools=(),
    allow_processes: bool = False,
    credentials: Credentials | None = None,
    skills: SkillLibrary | None = None,
) -> list[DefinitionError]:
    """Every refusal of a built-in agent's definition from outside (``allow_paths=False``) that
    its fields give checked one by one, where ``parse_definition`` stops at its first: each
    unknown key, each bad value, each unknown tool. ``[]`` when the text does not read as a
    table (its syntax, its size, a markdown file without front matter) or has a ``kind``:
    ``parse_definition``'s one refusal says what is wrong then. ``parse_definition`` still
    decides what is accepted; a definition with a refusal here is one it refuses.
    """
    try:
        if fmt == "md":
            if len(text) * 4 > MAX_DEFINITION_BYTES:
                return []
            markdown, found = read_markdown_refusals(text)
            raw = markdown.fields
            check_document(raw, "the definition")
        else:
            (raw, markdown), found = read_document(text, fmt, False), []
    except (DefinitionError, MalformedJson, ValueError, RecursionError):
        return []
    if "kind" in raw:
        return []
    return found + builtin_refusals(
        raw,
        markdown,
        known_tools=known_tools,
        allow_processes=allow_processes,
        credentials=credentials,
        library=skills,
    )


def _outside_kind(
    raw: dict,
    fmt: str,
    text: str,
    allow_processes: bool,
    known_tools,
    stored: bool,
    skills: SkillLibrary | None,
) -> AgentDefinition:
    """A definition with ``kind``: a process or a service agent, if the operator opted in."""
    kind = raw["kind"]
    expect(
        kind in KINDS,
        f"`kind` must be one of {', '.join(repr(k.value) for k in KINDS)} "
        "(or absent for a built-in agent)",
        ("kind",),
    )
    require_opt_in(kind, allow_processes)
    if kind == AgentKind.SERVICE:
        return service_agent(raw, fmt, text)
    return process_agent(raw, fmt, text, known_tools, stored, skills)


def load_definition(
    path: str | Path, *, known_tools=(), skills: SkillLibrary | None = None
) -> AgentDefinition:
    """Read a definition file (``.json`` is JSON, ``.md`` markdown, anything else TOML).

    Raises:
        DefinitionError: the file cannot be read or does not validate.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DefinitionError(f"cannot read agent file {str(path)!r}: {exc.strerror}") from None
    return parse_definition(
        text, format_of(path), base_dir=path.parent, known_tools=known_tools, skills=skills
    )
