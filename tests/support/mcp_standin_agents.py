"""A process agent on the ``mcp`` SDK for the stand-in tests, and how they read its MCP lane.

``AGENT`` is the script: its model the scripted provider, reached through the daemon's proxy in
the OpenAI chat format by a plain POST, its tools those of the server it spawns through
``$SALVOR_MCP_SERVER_FIX`` (stdio) or dials at ``$SALVOR_MCP_URL_FIX`` (streamable HTTP).
``standin_agent`` writes it beside a definition declaring that server; ``lane`` and ``lane_shape``
read the run's MCP exchanges back from its log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from salvor.daemon.agents._definition import parse_definition

AGENT = r"""
import asyncio, json, os, shlex, signal, sys, urllib.request
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client


try:
    from mcp.client.streamable_http import streamable_http_client
except ImportError:  # the SDK's older name
    from mcp.client.streamable_http import streamablehttp_client as streamable_http_client

transport = sys.argv[1]
server = os.environ.get("SERVER", "FIX")
die_after = int(os.environ.get("DIE_AFTER", "0"))
marker = Path(os.environ.get("MARKER", "/nonexistent/marker"))
suffix = os.environ.get("NOTE_SUFFIX", "")


def die_now():
    marker.write_text("died")
    os.kill(os.getpid(), signal.SIGKILL)


# The model is reached as an OpenAI client reaches it, at the proxy's $OPENAI_BASE_URL with its
# $OPENAI_API_KEY, by a plain POST: the openai SDK would cost half a second of imports at every
# agent start, and the SDK agents are tests/daemon/agents/test_process_agent's subject.
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def complete(messages, tools=None):
    body = {"model": "scripted-model", "messages": messages}
    if tools is not None:
        body["tools"] = tools
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
        },
    )
    with _no_proxy.open(request, timeout=600) as response:
        return json.loads(response.read())["choices"][0]["message"]


async def main():
    if transport == "none":
        complete([{"role": "user", "content": "hi"}])
        return
    if transport == "stdio":
        argv = shlex.split(os.environ[f"SALVOR_MCP_SERVER_{server}"])
        opened = stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]))
    else:
        Path("dialed").write_text(os.environ[f"SALVOR_MCP_URL_{server}"])
        opened = streamable_http_client(os.environ[f"SALVOR_MCP_URL_{server}"])
    async with opened as streams:

        async def heard(params):
            with open("heard.jsonl", "a") as f:
                f.write(json.dumps(params.data) + "\n")

        async def sample(context, params):
            with open("asked.jsonl", "a") as f:
                f.write(
                    json.dumps(
                        {
                            "max_tokens": params.maxTokens
                            if hasattr(params, "maxTokens")
                            else params.max_tokens
                        }
                    )
                    + "\n"
                )
            return types.CreateMessageResult(
                role="assistant",
                model="agent-model",
                content=types.TextContent(type="text", text="sampled by the agent"),
            )

        async with ClientSession(
            streams[0], streams[1], logging_callback=heard, sampling_callback=sample
        ) as mcp:
            await mcp.initialize()
            listed = await mcp.list_tools()
            tools = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description or "",
                        "parameters": getattr(t, "input_schema", None) or t.inputSchema,
                    },
                }
                for t in listed.tools
            ]
            messages = [{"role": "user", "content": os.environ["SALVOR_PROMPT"]}]
            done = 0
            while True:
                message = complete(messages, tools)
                calls = message.get("tool_calls") or []
                if not calls:
                    print(message.get("content"))
                    return
                messages.append(
                    {
                        "role": "assistant",
                        "content": message.get("content"),
                        "tool_calls": [
                            {
                                "id": c["id"],
                                "type": "function",
                                "function": {
                                    "name": c["function"]["name"],
                                    "arguments": c["function"]["arguments"],
                                },
                            }
                            for c in calls
                        ],
                    }
                )
                for c in calls:
                    name = c["function"]["name"]
                    arguments = json.loads(c["function"]["arguments"] or "{}")
                    if "text" in arguments:
                        arguments["text"] += suffix + "x" * int(os.environ.get("PAD_BYTES", "0"))
                    if os.environ.get("DIE_IN") == name and not marker.exists():
                        asyncio.get_running_loop().call_later(
                            float(os.environ["DIE_DELAY"]), die_now
                        )
                    if os.environ.get("SKIP_TOOLS"):
                        messages.append(
                            {"role": "tool", "tool_call_id": c["id"], "content": "skipped"}
                        )
                        continue
                    try:
                        result = await mcp.call_tool(name, arguments)
                    except (
                        Exception
                    ) as exc:  # a JSON-RPC error: the model reads it, as a tool error
                        with open("errors.jsonl", "a") as f:
                            f.write(json.dumps(str(exc)) + "\n")
                        messages.append(
                            {"role": "tool", "tool_call_id": c["id"], "content": f"error: {exc}"}
                        )
                        continue
                    done += 1
                    if die_after and done == die_after and not marker.exists():
                        die_now()
                    text = "".join(b.text for b in result.content if b.type == "text")
                    messages.append({"role": "tool", "tool_call_id": c["id"], "content": text})


asyncio.run(main())
"""


PLAN = [
    ("lookup", {"key": "a"}),
    ("write_note", {"text": "hi"}),
    ("lookup", {"key": "b"}),
    ("delete_everything", {}),
]


EFFECTS = 'effects = { lookup = "read", write_note = "write" }\n'


RESULTS = "results = { delete_everything = { deleted = 0 } }\n"


def standin_agent(
    tmp_path: Path,
    server: str,
    *,
    transport: str = "stdio",
    env: dict | None = None,
    server_extra: str = "",
    effects: str = EFFECTS,
    results: str = RESULTS,
):
    script = tmp_path / "mcp_agent.py"
    script.write_text(AGENT)
    env_table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (env or {}).items())
    text = (
        'name = "mcp-proc"\nkind = "process"\ncommand = '
        f"{json.dumps([sys.executable, str(script), transport])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n"
        f'[[mcp_servers]]\nname = "fix"\n{server}'
        f"{effects}"
        f"{results}{server_extra}"
        f"[env]\n{env_table}"
    )
    return parse_definition(text, "toml")


async def lane(runtime, run_id: str) -> list[tuple[str, object]]:
    """The run's MCP exchanges, in order: (tool, input)."""
    return [
        (env.event.tool, env.event.input)
        for env in await runtime.reads.log(run_id)
        if env.kind == "ToolCallRequested"
    ]


def lane_shape(calls) -> list[str]:
    return [
        tool if tool != "mcp:fix/tools/call" else f"call:{tool_input['name']}"
        for tool, tool_input in calls
    ]
