"""The scripted provider's reading of a request: an Anthropic Messages, OpenAI Chat Completions or
OpenAI Responses body turned into one neutral request (model, max_tokens, system, messages,
tools), so a script compares and hashes requests the same way whatever wire they came over.

Written independently of ``salvor.daemon.models._wire`` on purpose (see ``scripted_provider``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

JSON = dict[str, Any]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def _neutral_block(block: JSON) -> JSON | None:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block["text"]}
    if kind == "tool_use":
        return {
            "type": "tool_use",
            "id": block["id"],
            "name": block["name"],
            "input": block.get("input", {}),
        }
    if kind == "tool_result":
        out = {
            "type": "tool_result",
            "tool_use_id": block["tool_use_id"],
            "content": _text_of(block.get("content", "")),
        }
        if block.get("is_error"):
            out["is_error"] = True
        return out
    return None


def anthropic_to_neutral(body: JSON) -> JSON:
    request: JSON = {"model": body.get("model"), "max_tokens": body.get("max_tokens")}
    if body.get("system"):
        request["system"] = _text_of(body["system"])
    messages = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        blocks = [b for b in map(_neutral_block, content) if b is not None]
        messages.append({"role": message["role"], "content": blocks})
    request["messages"] = messages
    if body.get("tools"):
        request["tools"] = [
            {
                "name": t["name"],
                "description": t.get("description", ""),
                "input_schema": t.get("input_schema", {}),
            }
            for t in body["tools"]
        ]
    return request


def _turn_adder(messages: list[JSON]) -> Callable[[str, list[JSON]], None]:
    def add(role: str, blocks: list[JSON]) -> None:
        # Tool results and the user text after them are one neutral user turn.
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    return add


_NEUTRAL_ORDER = ("model", "max_tokens", "system", "messages", "tools")


def openai_to_neutral(body: JSON) -> JSON:
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    request: JSON = {"model": body.get("model"), "max_tokens": max_tokens}
    systems: list[str] = []
    messages: list[JSON] = []
    add = _turn_adder(messages)

    for message in body.get("messages", []):
        role = message.get("role")
        if role in ("system", "developer"):
            systems.append(_text_of(message.get("content")))
        elif role == "user":
            content = message.get("content")
            if isinstance(content, str):
                add("user", [{"type": "text", "text": content}])
            else:
                add(
                    "user",
                    [
                        {"type": "text", "text": p["text"]}
                        for p in content
                        if p.get("type") == "text"
                    ],
                )
        elif role == "tool":
            add(
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": message["tool_call_id"],
                        "content": _text_of(message.get("content")),
                    }
                ],
            )
        elif role == "assistant":
            blocks: list[JSON] = []
            text = _text_of(message.get("content"))
            if text:
                blocks.append({"type": "text", "text": text})
            for call in message.get("tool_calls") or []:
                arguments = call["function"].get("arguments") or "{}"
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": json.loads(arguments),
                    }
                )
            add("assistant", blocks)
    if systems:
        request["system"] = "\n\n".join(systems)
    request["messages"] = messages
    if body.get("tools"):
        request["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "input_schema": t["function"].get("parameters", {}),
            }
            for t in body["tools"]
        ]
    return {k: request[k] for k in _NEUTRAL_ORDER if k in request}


def _responses_turn(item: JSON, systems: list[str], add: Callable) -> None:
    """One Responses input item into the neutral conversation."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item["role"]
        text = _text_of(item.get("content"))
        if role in ("system", "developer"):
            systems.append(text)
        elif text:
            add("assistant" if role == "assistant" else "user", [{"type": "text", "text": text}])
    elif kind == "function_call":
        arguments = item.get("arguments") or "{}"
        add(
            "assistant",
            [
                {
                    "type": "tool_use",
                    "id": item["call_id"],
                    "name": item["name"],
                    "input": json.loads(arguments),
                }
            ],
        )
    elif kind == "function_call_output":
        add(
            "user",
            [
                {
                    "type": "tool_result",
                    "tool_use_id": item["call_id"],
                    "content": _text_of(item.get("output")),
                }
            ],
        )
    elif kind != "reasoning":
        # Reasoning items carry nothing a script answers from; anything else
        # (hosted tool calls, images, files) this provider cannot stand in for.
        raise ValueError(f"input item of type {kind!r} is not supported")


def responses_to_neutral(body: JSON) -> JSON:
    # A script answers from the conversation in the request; one kept on the
    # server would make its answer depend on more than the request.
    for kept in ("previous_response_id", "conversation"):
        if body.get(kept):
            raise ValueError(f"{kept} is not supported: send the whole conversation as input")
    request: JSON = {"model": body.get("model"), "max_tokens": body.get("max_output_tokens")}
    systems = [_text_of(body["instructions"])] if body.get("instructions") else []
    messages: list[JSON] = []
    add = _turn_adder(messages)
    items = body.get("input", [])
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for item in items:
        _responses_turn(item, systems, add)
    if systems:
        request["system"] = "\n\n".join(systems)
    request["messages"] = messages
    if body.get("tools"):
        for tool in body["tools"]:
            if tool.get("type") != "function":
                raise ValueError(f"tool of type {tool.get('type')!r} is not supported")
        request["tools"] = [
            {
                "name": t["name"],
                "description": t.get("description") or "",
                "input_schema": t.get("parameters") or {},
            }
            for t in body["tools"]
        ]
    return {k: request[k] for k in _NEUTRAL_ORDER if k in request}
