"""The demo model: a deterministic, offline, scripted planner.

It is not a language model and does not pretend to be one. It exists so the
README's first command and the demos run with no network and no API key, and
it is only ever used when an agent chooses ``provider = "demo"``.

Given a neutral model request it calls each offered tool once, in the order
the tools are listed, one call per answer; a tool that ends the work
(``submit_output``, a flow's ``finish``) is kept for last. Arguments are
filled from the run input, then from earlier tool results, then from
placeholders chosen by the schema's types (a required field always; an
optional one only when the run input names it; every field of a
``finish``, whose declared outputs a complete finish needs); a ``finish``
summary the input does not give is the text summary of what the tools
returned. When
every tool has been called it calls the closing tool if offered, else
answers with that text summary.

The answer is a pure function of the request: the same request gives the
same (response, usage) every time, which is what lets a recovered run re-issue
a model call and get the recorded answer back.
"""

from __future__ import annotations

import json
from typing import Any

JSON = dict[str, Any]

SUBMIT_OUTPUT = "submit_output"
FINISH = "finish"
# The tools that end the work: called last, once every other tool was.
_CLOSING = (SUBMIT_OUTPUT, FINISH)

_PLACEHOLDERS: dict[str, Any] = {
    "string": "demo",
    "integer": 1,
    "number": 1,
    "boolean": True,
    "object": {},
    "array": [],
    "null": None,
}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _parse_object(text: Any) -> JSON | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _result_text(content: Any) -> str:
    # Neutral tool results carry a string; tolerate Anthropic's block list too.
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return content if isinstance(content, str) else _canonical(content)


def _run_input(messages: list[JSON]) -> tuple[str, JSON]:
    """The first user message's first text, and its keys when it is an object."""
    for message in messages:
        if message.get("role") != "user":
            continue
        for block in message.get("content", []):
            if block.get("type") == "text":
                text = block.get("text", "")
                return text, _parse_object(text) or {}
        break
    return "", {}


class _Conversation:
    """What the demo model reads from a request's messages."""

    def __init__(self, messages: list[JSON]) -> None:
        self.input_text, self.run_input = _run_input(messages)
        self.tool_uses: list[JSON] = []
        self.results: dict[str, JSON] = {}
        for message in messages:
            for block in message.get("content", []):
                if block.get("type") == "tool_use":
                    self.tool_uses.append(block)
                elif block.get("type") == "tool_result":
                    self.results[block.get("tool_use_id", "")] = block

    def called(self) -> set[str]:
        # A tool that was called counts as done whether it succeeded or
        # failed: the demo model never retries a failed tool.
        return {use["name"] for use in self.tool_uses}

    def outcomes(self) -> list[tuple[str, JSON | None, str, bool]]:
        """(tool name, parsed object result, raw text, is_error) in call order."""
        rows = []
        for use in self.tool_uses:
            result = self.results.get(use["id"])
            if result is None:
                continue
            text = _result_text(result.get("content", ""))
            rows.append((use["name"], _parse_object(text), text, bool(result.get("is_error"))))
        return rows

    def value_for(self, key: str) -> tuple[bool, Any]:
        if key in self.run_input:
            return True, self.run_input[key]
        for _name, parsed, _text, is_error in reversed(self.outcomes()):
            if not is_error and parsed is not None and key in parsed:
                return True, parsed[key]
        return False, None


def _placeholder(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return "demo"
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return _PLACEHOLDERS.get(kind, "demo")


def _arguments(tool: JSON, conversation: _Conversation) -> JSON:
    schema = tool.get("input_schema") or {}
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    if tool["name"] == FINISH:
        # A finish's declared outputs are required only when it is complete (checked past the
        # schema), and the demo finishes complete: it fills every field finish offers.
        required = [*required, *(key for key in properties if key not in required)]
    arguments: JSON = {}
    for key in required:
        found, value = conversation.value_for(key)
        if found:
            arguments[key] = value
        elif key == "summary" and tool["name"] == FINISH:
            arguments[key] = _summary(conversation)
        else:
            arguments[key] = _placeholder(properties.get(key))
    for key in properties:
        if key not in arguments and key in conversation.run_input:
            arguments[key] = conversation.run_input[key]
    return arguments


def _summary(conversation: _Conversation) -> str:
    outcomes = conversation.outcomes()
    if not outcomes:
        return f"Demo model: no tools to call. The input was: {conversation.input_text}"
    lines = [f"Demo model: called {len(outcomes)} tool(s)."]
    for name, parsed, text, is_error in outcomes:
        shown = _canonical(parsed) if parsed is not None else text
        verb = "failed with" if is_error else "returned"
        lines.append(f"- {name} {verb} {shown}")
    return "\n".join(lines)


def demo_complete(request: JSON) -> tuple[JSON, JSON]:
    """Answer a neutral model request as the scripted planner.

    Args:
      request: a neutral ModelRequest (``model``, ``max_tokens``, ``messages``,
        optional ``system`` and ``tools``).

    Returns:
      ``(response, usage)``: a neutral ModelResponse and its Usage. Both are
      new plain-JSON dicts; the request is not modified.
    """
    tools = request.get("tools") or []
    conversation = _Conversation(request.get("messages") or [])
    called = conversation.called()

    pending = [t for t in tools if t["name"] not in _CLOSING and t["name"] not in called]
    closing = next((t for t in tools if t["name"] in _CLOSING), None)
    if not pending and closing is not None and closing["name"] not in called:
        pending = [closing]

    if pending:
        tool = pending[0]
        content: list[JSON] = [
            {
                "type": "tool_use",
                "id": f"toolu_demo_{len(conversation.tool_uses)}",
                "name": tool["name"],
                "input": _arguments(tool, conversation),
            }
        ]
        stop_reason = "tool_use"
    else:
        content = [{"type": "text", "text": _summary(conversation)}]
        stop_reason = "end_turn"

    response = {
        "model": request.get("model", "demo"),
        "content": content,
        "stop_reason": stop_reason,
    }
    usage = {
        "input_tokens": max(1, len(_canonical(request)) // 4),
        "output_tokens": max(1, len(_canonical(response)) // 4),
    }
    return response, usage
