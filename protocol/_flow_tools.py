"""The flow tools' shapes, pure: what each tool takes, which session offers it, what a question
asks of a person and how its answer is checked, and what a ``finish`` carries.

The tools themselves (``salvor.daemon.flows``) run in the daemon; everything here is data and
checks, shared by the built-in loop, the ``salvor`` MCP server a process agent reaches, graph
agent nodes and the authoring checks.

Sessions: a top-level run is the *main* session; a run something else started for its own ends
(a subagent's child, a graph's agent node, a map item) is a *child* session. Which tools a run
sees is the agent's opt-in intersected with its session's row (``offered_flow_tools``).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import SchemaViolation
from ._flow_declarations import DeclaredOutput
from ._fold import RunState
from ._schema import validate


class FlowTool(enum.StrEnum):
    """The tools a flow offers its agents."""

    ASK_USER = "ask_user"
    SUBAGENT = "subagent"
    FINISH = "finish"
    FLOW_RESULTS = "flow_results"
    FLOW_AGENTS = "flow_agents"
    FLOW_WRITE = "flow_write"
    ATTACH_TOOL = "attach_tool"


class Session(enum.StrEnum):
    """Where a run stands in its tree: the run a person started, or one started for another."""

    MAIN = "main"
    CHILD = "child"


# The availability matrix: what each session may be offered.
SESSION_TOOLS: dict[Session, frozenset[FlowTool]] = {
    Session.MAIN: frozenset(
        {
            FlowTool.ASK_USER,
            FlowTool.SUBAGENT,
            FlowTool.FLOW_RESULTS,
            FlowTool.FLOW_AGENTS,
            FlowTool.FLOW_WRITE,
            FlowTool.ATTACH_TOOL,
        }
    ),
    Session.CHILD: frozenset({FlowTool.ASK_USER, FlowTool.FINISH}),
}
# What an agent authors with: a linked tree's child sessions are offered them too.
AUTHORING_TOOLS = frozenset({FlowTool.FLOW_AGENTS, FlowTool.FLOW_WRITE})
# Offered only while the operator has edit mode on: authoring, and attaching tools to the tree.
EDIT_MODE_TOOLS = AUTHORING_TOOLS | {FlowTool.ATTACH_TOOL}


def offered_flow_tools(
    opted_in: Iterable[FlowTool], session: Session, *, edit_mode: bool, linked: bool = False
) -> list[FlowTool]:
    """The flow tools a run of an agent that opted into ``opted_in`` sees, in ``FlowTool`` order.

    A run tree that came over a link (``linked``) is a flow the person at the client runs to
    author their project: its child sessions (a graph's agent nodes, the items of its maps) are
    offered the authoring tools too, since what they write is saved on the client.
    """
    allowed = SESSION_TOOLS[session] | (AUTHORING_TOOLS if linked else frozenset())
    wanted = set(opted_in) & allowed
    if not edit_mode:
        wanted -= EDIT_MODE_TOOLS
    return [tool for tool in FlowTool if tool in wanted]


# -- ask_user -------------------------------------------------------------------------------------


class QuestionType(enum.StrEnum):
    INPUT = "input"
    SELECT = "select"
    CONFIRM = "confirm"


ASK_USER_DESCRIPTION = (
    "Ask the person who runs this flow a question and wait for the answer: free text (`input`), "
    "a choice among `options` (`select`, several with `multiSelect`, any text with "
    "`allowCustom`), or yes/no (`confirm`). The run waits, durably, until someone answers."
)
ASK_USER_SCHEMA = {
    "type": "object",
    "required": ["question", "type"],
    "additionalProperties": False,
    "properties": {
        "question": {"type": "string", "minLength": 1, "description": "The question text"},
        "type": {"enum": [t.value for t in QuestionType], "description": "Interaction type"},
        "options": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "description": "Choices for select",
        },
        "multiSelect": {"type": "boolean", "description": "Allow several (select only)"},
        "allowCustom": {"type": "boolean", "description": "Accept any text too (select only)"},
        "defaultValue": {"type": "string", "description": "Pre-filled default (input only)"},
    },
}


class BadQuestion(ValueError):
    """An ``ask_user`` call that asks nothing answerable; the message says what to change."""


def question_schema(args: Any) -> dict:
    """The ``input_schema`` a person's answer to ``args`` is checked against: ``{"answer": ...}``
    typed as the question asks (a string, one of the options, an array of them, a boolean).

    The answer object is exactly what the ``ask_user`` call returns, so the resume input is the
    tool's result.

    Raises:
        BadQuestion: ``args`` breaks the tool's schema or combines fields that mean nothing
            together (options on a confirm, a default on a select, a select without options).
    """
    try:
        validate(ASK_USER_SCHEMA, args, what="the ask_user call")
    except SchemaViolation as exc:
        raise BadQuestion(exc.message) from None
    kind = QuestionType(args["type"])
    options = args.get("options")
    for field in ("options", "multiSelect", "allowCustom"):
        if field in args and kind is not QuestionType.SELECT:
            raise BadQuestion(f"`{field}` belongs to a select question, not to {kind.value!r}")
    if "defaultValue" in args and kind is not QuestionType.INPUT:
        raise BadQuestion(f"`defaultValue` belongs to an input question, not to {kind.value!r}")
    answer: dict[str, Any]
    if kind is QuestionType.INPUT:
        answer = {"type": "string"}
        if "defaultValue" in args:
            answer["default"] = args["defaultValue"]
    elif kind is QuestionType.CONFIRM:
        answer = {"type": "boolean"}
    else:
        if not options:
            raise BadQuestion("a select question needs `options`")
        if len(set(options)) != len(options):
            raise BadQuestion("a select question lists one option twice")
        choice: dict[str, Any] = (
            {"type": "string", "examples": list(options)}
            if args.get("allowCustom")
            else {"type": "string", "enum": list(options)}
        )
        answer = (
            {"type": "array", "items": choice, "minItems": 1, "uniqueItems": True}
            if args.get("multiSelect")
            else choice
        )
    answer["description"] = args["question"]
    return {
        "type": "object",
        "required": ["answer"],
        "additionalProperties": False,
        "properties": {"answer": answer},
    }


# -- finish ---------------------------------------------------------------------------------------


class FinishStatus(enum.StrEnum):
    COMPLETE = "complete"
    ERROR = "error"
    BLOCKED = "blocked"


FINISH_DESCRIPTION = (
    "Submit your final result and end your work: `status`, a brief `summary`, and the outputs "
    "your definition declares. Call it last; no tool can be called after it."
)


def finish_schema(
    outputs: Sequence[DeclaredOutput] = (), branches: Sequence[str] | None = None
) -> dict:
    """The ``finish`` tool's input schema for an agent declaring ``outputs``; with ``branches``
    (an agent-decision step), ``branch`` is required and one of them.

    Declared outputs appear as typed top-level fields; which are required depends on the status
    (``check_finish``), so the schema lists them without requiring them.
    """
    properties: dict[str, Any] = {
        "status": {"enum": [s.value for s in FinishStatus]},
        "summary": {"type": "string", "description": "What was done, or what went wrong"},
    }
    required = ["status", "summary"]
    if branches is not None:
        properties["branch"] = {
            "type": "string",
            "enum": list(branches),
            "description": "Which way the flow goes on from here",
        }
        required.append("branch")
    for output in outputs:
        properties[output.name] = output.schema()
    return {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }


def check_finish(
    args: Any, outputs: Sequence[DeclaredOutput] = (), branches: Sequence[str] | None = None
) -> dict:
    """The result a ``finish`` call records: ``{status, summary, outputs, branch?}`` with each
    declared output under ``outputs`` in its JSON type.

    Raises:
        SchemaViolation: ``args`` breaks the finish schema, or a ``complete`` finish lacks a
            required output (the message names it); nothing is a result.
    """
    validate(finish_schema(outputs, branches), args, what="the finish call")
    if args["status"] == FinishStatus.COMPLETE:
        missing = [o.name for o in outputs if o.required and o.name not in args]
        if missing:
            message = (
                f"a complete finish needs the output{'s' if len(missing) > 1 else ''} "
                f"{', '.join(f'`{name}`' for name in missing)}"
            )
            raise SchemaViolation(
                f"the finish call does not satisfy the recorded schema: {message}",
                violations=[{"path": "$", "message": message}],
            )
    result: dict[str, Any] = {
        "status": args["status"],
        "summary": args["summary"],
        "outputs": {o.name: args[o.name] for o in outputs if o.name in args},
    }
    if "branch" in args:
        result["branch"] = args["branch"]
    return result


def is_finish_result(value: Any) -> bool:
    """Whether ``value`` has the shape ``check_finish`` returns (a child run's recorded output)."""
    return (
        isinstance(value, dict)
        and value.get("status") in set(FinishStatus)
        and isinstance(value.get("summary"), str)
        and isinstance(value.get("outputs"), dict)
    )


def text_result(text: str) -> dict:
    """The result of a child that answered in text without calling finish: complete, its text as
    the summary, no outputs."""
    return {"status": FinishStatus.COMPLETE.value, "summary": text, "outputs": {}}


def run_result(state: RunState, detail: Mapping[str, Any]) -> dict | None:
    """What a run resting in ``state`` came to, as a finish result; None while it has not ended.

    ``detail`` is its fold's detail (its terminal event's payload). A completed run's output is
    its result when it is a finish result (a copy: a caller may add to it), else a complete one
    whose summary is the output's text (JSON for a non-string, keys sorted so one output always
    reads the same, its letters as they are); a failed or an abandoned run is an ``error``
    result whose summary is why (its error, its reason). The subagent call's answer and
    ``flow_results`` both read a child through this, so they never disagree.
    """
    if state is RunState.COMPLETED:
        output = detail.get("output")
        if is_finish_result(output):
            return dict(output)
        text = (
            output
            if isinstance(output, str)
            else json.dumps(output, ensure_ascii=False, sort_keys=True)
        )
        return text_result(text)
    if state in (RunState.FAILED, RunState.ABANDONED):
        why = detail.get("error") or detail.get("reason") or state.value
        return {"status": FinishStatus.ERROR.value, "summary": str(why), "outputs": {}}
    return None


# -- the other tools' inputs ----------------------------------------------------------------------

SUBAGENT_DESCRIPTION = (
    "Hand a task to another registered agent and wait for its result (status, summary and its "
    "typed outputs). The child is a durable run of its own; it is started once."
)
SUBAGENT_SCHEMA = {
    "type": "object",
    "required": ["agent", "task"],
    "additionalProperties": False,
    "properties": {
        "agent": {"type": "string", "minLength": 1, "description": "Agent name (in the catalog)"},
        "task": {"type": "string", "description": "Task description"},
        "inputs": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Named inputs (key -> value)",
        },
    },
}


class ResultsAction(enum.StrEnum):
    LIST = "list"
    SUMMARY = "summary"
    AGENT = "agent"
    RUNS = "runs"


FLOW_RESULTS_DESCRIPTION = (
    "Read, never change, what this run's flows did: `list` the finished results, a flow's per-step "
    "`summary`, one `agent` step in full, or the `runs` with their per-node state."
)
FLOW_RESULTS_SCHEMA = {
    "type": "object",
    "required": ["action"],
    "additionalProperties": False,
    "properties": {
        "action": {"enum": [a.value for a in ResultsAction]},
        "flow": {
            "type": "string",
            "description": (
                "Which run: one this run started (its id, its agent's name, a flow it wrote), or "
                "a flow's namespace/name (its newest run); required for summary and agent"
            ),
        },
        "agent": {"type": "string", "description": "Required for agent"},
    },
}
FLOW_AGENTS_DESCRIPTION = (
    "List the agent catalog (`op: list`), or validate and register an agent file (`op: write`, "
    "its markdown `content`); answers with the diagnostics, and writes nothing on an error."
)
FLOW_AGENTS_SCHEMA = {
    "type": "object",
    "required": ["op"],
    "additionalProperties": False,
    "properties": {
        "op": {"enum": ["list", "write"]},
        "content": {"type": "string", "description": "The agent file (op: write)"},
    },
}
FLOW_WRITE_DESCRIPTION = (
    "Validate and store a graph document (YAML or JSON `content`) as the flow "
    "`namespace`/`name`: writing a name again with other content makes its next version (the "
    "earlier ones are kept for runs already started). Answers with the diagnostics and the "
    "version, and stores nothing on an error."
)
FLOW_WRITE_SCHEMA = {
    "type": "object",
    "required": ["name", "content"],
    "additionalProperties": False,
    "properties": {
        "namespace": {"type": "string", "description": 'Flow namespace (default "custom")'},
        "name": {"type": "string", "minLength": 1},
        "content": {"type": "string"},
    },
}

ATTACH_TOOL_DESCRIPTION = (
    "Attach registry tools, by name, to this run and every child it starts from now on: you "
    "are offered them from your next turn (an MCP server the operator declared is mcp:NAME, "
    "and offers its tools). Only the tools the operator allows may be attached."
)
ATTACH_TOOL_SCHEMA = {
    "type": "object",
    "required": ["tools"],
    "additionalProperties": False,
    "properties": {
        "tools": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "description": "Registry tool names, or mcp:NAME for a declared MCP server",
        },
    },
}

# What the model sees of each tool besides finish (whose schema is the agent's own).
TOOL_SHAPES: dict[FlowTool, tuple[str, dict]] = {
    FlowTool.ASK_USER: (ASK_USER_DESCRIPTION, ASK_USER_SCHEMA),
    FlowTool.SUBAGENT: (SUBAGENT_DESCRIPTION, SUBAGENT_SCHEMA),
    FlowTool.FLOW_RESULTS: (FLOW_RESULTS_DESCRIPTION, FLOW_RESULTS_SCHEMA),
    FlowTool.FLOW_AGENTS: (FLOW_AGENTS_DESCRIPTION, FLOW_AGENTS_SCHEMA),
    FlowTool.FLOW_WRITE: (FLOW_WRITE_DESCRIPTION, FLOW_WRITE_SCHEMA),
    FlowTool.ATTACH_TOOL: (ATTACH_TOOL_DESCRIPTION, ATTACH_TOOL_SCHEMA),
}


# -- authoring diagnostics ------------------------------------------------------------------------


class Severity(enum.StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding of an authoring check, at a 1-based line of the text checked."""

    line: int
    severity: Severity
    message: str
    suggestion: str | None = None

    def to_json(self) -> dict:
        body: dict[str, Any] = {
            "line": self.line,
            "severity": self.severity.value,
            "message": self.message,
        }
        if self.suggestion is not None:
            body["suggestion"] = self.suggestion
        return body
