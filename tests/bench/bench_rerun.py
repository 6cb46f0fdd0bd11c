"""Benchmark: how fast a recorded agent-process run is re-run with zero upstream calls.

A real agent process (the openai SDK, Chat Completions, a tool loop) makes
``--turns`` model calls against the scripted provider, which runs in a
process of its own. Three runs of the same agent:

* ``direct``: the agent talks to the provider itself, no salvor at all (the
  baseline: what the agent and the provider cost on this machine);
* ``record``: a salvor run through the loopback proxy, every call recorded
  live (intent before forwarding, completion after) in a real store;
* ``rerun``: ``replay_of`` the recorded run: every call is checked against
  the origin's at its position and answered from its log, never upstream
  (the re-run's session has no upstream at all), and recorded in the re-run's
  own log.

Each reports turns per second over the whole process (start to exit, SDK
import included) and over its turns alone (first call to last answer, as the
agent timed them). Target: re-run >= 300 turns/s. Prints one JSON object;
never a timed assertion.

    python tests/bench/bench_rerun.py [--turns 200] [--dir DIR] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio

AGENT = r"""
import json, os, sys, time
import openai

client = openai.OpenAI(max_retries=0)
tools = [
    {
        "type": "function",
        "function": {
            "name": "lookup_invoice",
            "description": "Look up an invoice.",
            "parameters": {"type": "object", "properties": {"invoice": {"type": "string"}}},
        },
    }
]
messages = [{"role": "user", "content": os.environ.get("SALVOR_PROMPT", "settle every invoice")}]
stamps = []
while True:
    reply = client.chat.completions.create(model="scripted-model", messages=messages, tools=tools)
    stamps.append(time.perf_counter())
    message = reply.choices[0].message
    if not message.tool_calls:
        break
    calls = [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.function.name, "arguments": c.function.arguments},
        }
        for c in message.tool_calls
    ]
    messages.append({"role": "assistant", "content": message.content, "tool_calls": calls})
    for c in calls:
        messages.append(
            {"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"amount": 42})}
        )
with open(os.environ["STAMPS"], "w") as out:
    json.dump({"first": stamps[0], "last": stamps[-1], "turns": len(stamps)}, out)
"""


# The leanest client that still speaks HTTP to the proxy: it posts the
# origin's recorded request bodies in order over one kept-alive connection,
# so the re-run's rate is salvor's own cost per turn, not an SDK's.
LEAN_AGENT = r"""
import http.client, json, os, time
from urllib.parse import urlsplit

base = urlsplit(os.environ["OPENAI_BASE_URL"])
connection = http.client.HTTPConnection(base.hostname, base.port)
stamps = []
with open(os.environ["BODIES"]) as bodies:
    for line in bodies:
        connection.request("POST", base.path + "/chat/completions", body=line.encode(),
                           headers={"content-type": "application/json"})
        reply = connection.getresponse()
        reply.read()
        if reply.status != 200:
            raise SystemExit(f"turn {len(stamps) + 1}: {reply.status}")
        stamps.append(time.perf_counter())
with open(os.environ["STAMPS"], "w") as out:
    json.dump({"first": stamps[0], "last": stamps[-1], "turns": len(stamps)}, out)
"""


def _sdk_floor(turns: int) -> float:
    """Turns/s of the agent's own SDK work alone: the same loop against an
    in-process, zero-cost transport."""
    import httpx
    import openai

    def answer(request: httpx.Request) -> httpx.Response:
        asked = json.loads(request.content)
        done = sum(1 for m in asked["messages"] if m["role"] == "tool") >= turns - 1
        message = (
            {"role": "assistant", "content": "all settled"}
            if done
            else {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "lookup_invoice", "arguments": "{}"},
                    }
                ],
            }
        )
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "scripted-model",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop" if done else "tool_calls",
                        "message": message,
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    client = openai.OpenAI(
        api_key="k",
        base_url="http://floor/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(answer)),
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_invoice",
                "description": "Look up an invoice.",
                "parameters": {"type": "object", "properties": {"invoice": {"type": "string"}}},
            },
        }
    ]
    messages: list = [{"role": "user", "content": "settle every invoice"}]
    began = time.perf_counter()
    for _ in range(turns):
        message = (
            client.chat.completions.create(model="scripted-model", messages=messages, tools=tools)
            .choices[0]
            .message
        )
        if not message.tool_calls:
            break
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in message.tool_calls
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": "c", "content": json.dumps({"amount": 42})}
        )
    return round(turns / (time.perf_counter() - began), 1)


def _provider(queue, turns: int) -> None:
    from tests.support.scripted_provider import ScriptedProvider, tool_loop_script

    plan = [("lookup_invoice", {"invoice": f"INV-{k}"}) for k in range(turns - 1)]
    provider = ScriptedProvider(tool_loop_script(plan, final_text="all settled"))
    queue.put(provider.base_url)
    time.sleep(10**6)


def _rates(turns: int, began: float, ended: float, stamps_file: Path) -> dict:
    stamps = json.loads(stamps_file.read_text())
    steady = stamps["last"] - stamps["first"]
    return {
        "turns": stamps["turns"],
        "seconds": round(ended - began, 3),
        "turns_per_s": round(turns / (ended - began), 1),
        "turns_per_s_steady": round((stamps["turns"] - 1) / steady, 1) if steady > 0 else None,
    }


async def run(turns: int, scratch: Path, store_url: str, provider_url: str) -> dict:
    from salvor.daemon.agents._definition import parse_definition
    from salvor.daemon.proxies import open_model_proxy
    from salvor.daemon.recording._store_access import open_store_access
    from salvor.daemon.runs._runtime import Runtime
    from salvor.daemon.tools._registry import ToolRegistry
    from salvor.protocol import EventKind

    script = scratch / "agent.py"
    script.write_text(AGENT)
    stamps = scratch / "stamps.json"
    results: dict = {"turns": turns, "store": store_url.split(":", 1)[0]}

    # The baseline: the same agent, straight to the provider.
    env = {
        **os.environ,
        "OPENAI_BASE_URL": f"{provider_url}/v1",
        "OPENAI_API_KEY": "k",
        "STAMPS": str(stamps),
    }
    began = time.perf_counter()
    await trio.run_process([sys.executable, str(script)], env=env)
    results["direct"] = _rates(turns, began, time.perf_counter(), stamps)

    results["sdk_floor_turns_per_s"] = await trio.to_thread.run_sync(_sdk_floor, turns)

    def definition(path: Path, **env: str):
        table = "".join(
            f"{k} = {json.dumps(v)}\n" for k, v in {"STAMPS": str(stamps), **env}.items()
        )
        return parse_definition(
            'kind = "process"\ncommand = '
            f"{json.dumps([sys.executable, str(path)])}\ntimeout = 600\n"
            f"record_prompts = true\n[env]\n{table}",
            "toml",
        )

    agent = definition(script)
    os.environ["SALVOR_AGENT_UPSTREAM"] = provider_url
    os.environ["SALVOR_AGENT_KEY"] = "bench-key"
    async with open_store_access(store_url) as access, open_model_proxy() as proxy:
        runtime = Runtime(access, ToolRegistry(), proxy=proxy)
        origin = await runtime.starts.start_run(agent, "settle every invoice")
        began = time.perf_counter()
        view = await runtime.drive(origin, agent=agent)
        results["record"] = _rates(turns, began, time.perf_counter(), stamps)
        results["record"]["state"] = view.state.value

        # Nothing can reach the provider from here on.
        del os.environ["SALVOR_AGENT_UPSTREAM"], os.environ["SALVOR_AGENT_KEY"]
        rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
        began = time.perf_counter()
        view = await runtime.drive(rerun, agent=agent)
        results["rerun"] = _rates(turns, began, time.perf_counter(), stamps)
        results["rerun"]["state"] = view.state.value
        completed = [
            e
            for e in await runtime.reads.log(rerun)
            if e.event.KIND is EventKind.MODEL_CALL_COMPLETED
        ]
        results["rerun"]["recorded_calls"] = len(completed)

        # The same re-run from the lean client: the origin's request bodies, in order.
        bodies = scratch / "bodies.jsonl"
        requested = [
            e.event
            for e in await runtime.reads.log(origin)
            if e.event.KIND is EventKind.MODEL_CALL_REQUESTED
        ]
        bodies.write_text(
            "".join(json.dumps(event.request_body["body"]) + "\n" for event in requested)
        )
        lean_script = scratch / "lean_agent.py"
        lean_script.write_text(LEAN_AGENT)
        lean = definition(lean_script, BODIES=str(bodies))
        rerun = await runtime.starts.start_run(lean, None, replay_of=origin)
        began = time.perf_counter()
        view = await runtime.drive(rerun, agent=lean)
        results["rerun_lean_client"] = _rates(turns, began, time.perf_counter(), stamps)
        results["rerun_lean_client"]["state"] = view.state.value
    results["rerun_vs_direct"] = round(
        results["rerun"]["turns_per_s"] / results["direct"]["turns_per_s"], 3
    )
    results["rerun_vs_sdk_floor"] = round(
        results["rerun"]["turns_per_s_steady"] / results["sdk_floor_turns_per_s"], 3
    )
    results["target_turns_per_s"] = 300
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench_rerun_"))
    store_url = args.store or f"sqlite:///{scratch / 'salvor.db'}"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    provider = context.Process(target=_provider, args=(queue, args.turns), daemon=True)
    provider.start()
    try:
        provider_url = queue.get(timeout=30)
        print(json.dumps(trio.run(run, args.turns, scratch, store_url, provider_url), indent=2))
    finally:
        provider.terminate()


if __name__ == "__main__":
    main()
