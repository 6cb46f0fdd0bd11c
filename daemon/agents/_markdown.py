"""Markdown agent files (as pi-flows writes them): YAML front matter between ``---`` lines, the
body the system prompt.

A markdown file stands for the TOML definition of the same fields: ``skills`` (a comma-separated
string or a list) is the TOML array, ``tools`` (the same) splits into the flow tools it names
(``flow_tools``) and the registry tools (``[[tools]]``), the body becomes ``system_prompt``,
every other key is the TOML key of its name. So a markdown file and its TOML twin hash alike.
``card`` and ``architect`` are display metadata for the catalog, kept beside the definition and
out of its hash like ``name``.

Every key keeps its line, so a refusal points at the line that holds the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from salvor.protocol import FlowTool, MalformedYaml, load_yaml

from ._definition_error import DefinitionError, did_you_mean, suggest

_FENCE = "---"
# The front matter's keys that are the TOML definition's keys of the same name.
_SAME_AS_TOML = (
    "name",
    "description",
    "model",
    "inputs",
    "outputs",
    "llm",
    "budgets",
    "pricing",
    "max_response_tokens",
    "record_prompts",
    "mcp_servers",
    "access",
    "skills",
)
_DISPLAY = ("card", "architect")
FRONT_MATTER_KEYS = frozenset({*_SAME_AS_TOML, "tools", *_DISPLAY})
_FLOW_TOOL_NAMES = frozenset(tool.value for tool in FlowTool)
# A key at the start of a line, and the line's indent: where a front-matter key is written.
_KEY = re.compile(r"^(?P<indent>[ ]*)(?:- )?(?P<key>[A-Za-z_][A-Za-z0-9_-]*)[ ]*:(?:[ ]|$)")


@dataclass(frozen=True, slots=True)
class MarkdownAgent:
    """A markdown agent file read: the definition's fields, the display metadata, and lines.

    ``lines``: the 1-based line of each front-matter key. ``body_line``: the line the system
    prompt starts on (None when the body is empty).
    """

    fields: dict[str, Any]
    lines: dict[str, int]
    body_line: int | None
    card: dict | None = None
    architect: dict | None = None
    # The line of each key nested one level under a top-level key: (top, key) -> line.
    nested_lines: dict[tuple[str, str], int] = field(default_factory=dict)
    # The line of each entry of ``tools`` written as a block list: (name, line), in order.
    tool_items: tuple[tuple[str, int], ...] = ()

    def line_of(self, at: tuple[str | int, ...]) -> int:
        """The line of the definition field ``at`` (``DefinitionError.at``); 1 when the field is
        not written (a missing required key) or the fault is the whole file."""
        if not at:
            return 1
        top = at[0]
        if top == "system_prompt":
            return self.body_line or 1
        key = "tools" if top == "flow_tools" else str(top)
        line = self.lines.get(key)
        if line is None:
            return 1
        if key == "tools" and len(at) > 1 and isinstance(at[1], int):
            # A registry tool's index counts registry tools, a flow tool's flow tools.
            flow = top == "flow_tools"
            items = [n for n in self.tool_items if (n[0] in _FLOW_TOOL_NAMES) == flow]
            if at[1] < len(items):
                return items[at[1]][1]
        nested = next((part for part in at[1:] if isinstance(part, str)), None)
        if nested is not None and (key, nested) in self.nested_lines:
            return self.nested_lines[(key, nested)]
        return line


def _fence_lines(text: str) -> tuple[list[str], int]:
    """The file's lines and the index of the fence closing its front matter.

    Raises:
        DefinitionError: there is no front matter.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].rstrip() != _FENCE:
        raise DefinitionError(
            "a markdown agent file opens with `---`, then its front matter (YAML: `name`, "
            "`model`, ...), then `---` and the system prompt",
            at=(),
        )
    for index in range(1, len(lines)):
        if lines[index].rstrip() == _FENCE:
            return lines, index
    raise DefinitionError(
        "the front matter opened by `---` on line 1 is never closed by a `---` line", at=()
    )


def _key_lines(
    front: list[str],
) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """The line of each top-level key of the front matter, and of each key one level under it
    (file lines: the front matter starts on line 2)."""
    lines: dict[str, int] = {}
    nested: dict[tuple[str, str], int] = {}
    top: str | None = None
    nested_indent: int | None = None
    for offset, text in enumerate(front):
        found = _KEY.match(text)
        if found is None:
            continue
        line = offset + 2
        indent = len(found["indent"])
        if indent == 0 and not text.startswith("- "):
            top, nested_indent = found["key"], None
            lines.setdefault(top, line)
        elif top is not None:
            if nested_indent is None:
                nested_indent = indent
            if indent == nested_indent:
                nested.setdefault((top, found["key"]), line)
    return lines, nested


_ITEM = re.compile(r"^[ ]*- [ ]*(?P<name>[^#\s][^#]*?)[ ]*(?:#.*)?$")


def _tool_items(front: list[str], key_lines: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """The entries of ``tools`` written as a block list, each with its file line."""
    line = key_lines.get("tools")
    if line is None or front[line - 2].split(":", 1)[1].strip():
        return ()
    items = []
    for offset in range(line - 1, len(front)):
        found = _ITEM.match(front[offset])
        if found is None:
            break
        items.append((found["name"].strip("\"'"), offset + 2))
    return tuple(items)


def markdown_line(text: str, at: tuple[str | int, ...]) -> int:
    """The line of the definition field ``at`` in a markdown agent file, read only as far as its
    lines (the file need not validate); 1 when it has no front matter or the key is not written."""
    try:
        lines, closing = _fence_lines(text)
    except DefinitionError:
        return 1
    key_lines, nested = _key_lines(lines[1:closing])
    _, body_line = _body(lines, closing + 1)
    items = _tool_items(lines[1:closing], key_lines)
    return MarkdownAgent({}, key_lines, body_line, nested_lines=nested, tool_items=items).line_of(
        at
    )


def _display(key: str, value: Any, line: int) -> dict:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise DefinitionError(
            f"`{key}` (line {line}) must be a table of strings, as the catalog shows it",
            at=(key,),
        )
    return dict(value)


def _comma_list(value: Any) -> Any:
    """A comma-separated string's names (blanks dropped); nothing for an empty key; any other
    value as it is (the definition's check refuses what is not a list of names)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [name for name in (part.strip() for part in value.split(",")) if name]
    return value


def _split_tools(value: Any) -> tuple[list[str], list[str]]:
    """``tools``: the flow tools it names, and the registry tools, each in the order given."""
    if value is None:  # `tools:` with nothing after it
        names = []
    elif isinstance(value, str):
        names = [part.strip() for part in value.split(",")]
        names = [name for name in names if name]
    elif isinstance(value, list) and all(isinstance(name, str) for name in value):
        names = list(value)
    else:
        raise DefinitionError(
            "`tools` must be a comma-separated string or a list of tool names", at=("tools",)
        )
    flow = [name for name in names if name in _FLOW_TOOL_NAMES]
    registry = [name for name in names if name not in _FLOW_TOOL_NAMES]
    return flow, registry


def _body(lines: list[str], start: int) -> tuple[str | None, int | None]:
    """The system prompt: the lines after the closing fence, blank lines at both ends dropped."""
    body = lines[start:]
    first = next((i for i, line in enumerate(body) if line.strip()), None)
    if first is None:
        return None, None
    last = max(i for i, line in enumerate(body) if line.strip())
    return "\n".join(body[first : last + 1]), start + first + 1


def read_markdown(text: str) -> MarkdownAgent:
    """The fields a markdown agent file stands for (the TOML definition's), with its lines.

    Raises:
        DefinitionError: no front matter, front matter that is not a strict YAML table, or a key
            that is not one of ``FRONT_MATTER_KEYS`` (with the nearest as its suggestion); ``at``
            the key. The fields themselves are checked by ``parse_definition``.
    """
    agent, refusals = read_markdown_refusals(text)
    if refusals:
        raise refusals[0]
    return agent


def read_markdown_refusals(text: str) -> tuple[MarkdownAgent, list[DefinitionError]]:
    """``read_markdown``'s reading, every refusal of the front matter's keys collected (in the
    order ``read_markdown`` meets them, its first the one it raises) instead of the first: the
    fields are those of the keys that read, for the diagnostics to check one by one.

    Raises:
        DefinitionError: no front matter, or front matter that is not a strict YAML table
            (nothing else can be read of it).
    """
    lines, closing = _fence_lines(text)
    front = lines[1:closing]
    try:
        value = load_yaml("\n".join(front), "the front matter")
    except MalformedYaml as exc:
        # The YAML reader counts from the front matter's first line, the file from its fence.
        message = re.sub(
            r"line (\d+)", lambda found: f"line {int(found[1]) + 1}", exc.message, count=1
        )
        raise DefinitionError(message, at=()) from None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise DefinitionError("the front matter must be a table of keys (`name: ...`)", at=())
    key_lines, nested = _key_lines(front)
    refusals = [_unknown_key(key) for key in value if key not in FRONT_MATTER_KEYS]
    if "name" not in value:
        refusals.append(
            DefinitionError(
                "a markdown agent file needs `name` in its front matter (the catalog's name for "
                "it)",
                at=("name",),
            )
        )
    fields = {key: value[key] for key in _SAME_AS_TOML if key in value}
    if "skills" in fields:
        # `skills: a, b` as `tools` is written; a list stays a list.
        fields["skills"] = _comma_list(fields["skills"])
    if "tools" in value:
        try:
            flow, registry = _split_tools(value["tools"])
        except DefinitionError as exc:
            refusals.append(exc)
            flow, registry = [], []
        if flow:
            fields["flow_tools"] = flow
        if registry:
            fields["tools"] = [{"name": name} for name in registry]
    prompt, body_line = _body(lines, closing + 1)
    if prompt is not None:
        fields["system_prompt"] = prompt
    display: dict[str, dict] = {}
    for key in _DISPLAY:
        if key in value:
            try:
                display[key] = _display(key, value[key], key_lines.get(key, 1))
            except DefinitionError as exc:
                refusals.append(exc)
    agent = MarkdownAgent(
        fields=fields,
        lines=key_lines,
        body_line=body_line,
        card=display.get("card"),
        architect=display.get("architect"),
        nested_lines=nested,
        tool_items=_tool_items(front, key_lines),
    )
    return agent, refusals


def _unknown_key(key: Any) -> DefinitionError:
    near = suggest(key, FRONT_MATTER_KEYS) if isinstance(key, str) else None
    return DefinitionError(
        f"unknown key `{key}` in the front matter{did_you_mean(near)}; allowed: "
        f"{', '.join(sorted(FRONT_MATTER_KEYS))}",
        at=(key,),
        suggestion=near,
    )
