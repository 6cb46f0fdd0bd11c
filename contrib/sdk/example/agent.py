"""A client-driven agent loop on salvor_client: the loop here, the log in the daemon.

The daemon performs the model calls (it holds the key: start it with
ANTHROPIC_API_KEY, or SALVOR_MODEL_BASE_URL for a local Messages endpoint);
this process performs `lookup_order` itself, with its own data, as a
declared client tool (`salvor serve --client-tool contrib/sdk/example/lookup_order.toml`).

Run it, kill it at any point, run it again with the printed run id: every
step already recorded is answered from the log and the loop carries on.

    python contrib/sdk/example/agent.py http://127.0.0.1:8420 "Where is order o-17?" [RUN_ID]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from salvor_client import ClientRun

ORDERS = {"o-17": {"status": "shipped", "carrier": "DHL"}, "o-18": {"status": "packing"}}
TOOLS = [
    {
        "name": "lookup_order",
        "description": "Look an order up by id.",
        "input_schema": {
            "type": "object",
            "required": ["order_id"],
            "properties": {"order_id": {"type": "string"}},
        },
    }
]
AGENT = (
    "sha256:" + "0" * 64
)  # this loop is not a registered definition; the hash names it in listings


async def lookup_order(tool_input: dict, key: str) -> dict:
    # The client's own data source; `key` is the idempotency key the daemon derived for this call.
    return ORDERS.get(tool_input["order_id"], {"status": "unknown"})


async def drive(
    base_url: str, task: str, run_id: str | None = None, *, model: str = "claude-sonnet-4-5"
) -> dict:
    """Drive the run to its end; returns its output. Safe to call again with the same run id."""
    async with ClientRun(base_url, run_id=run_id, auth_token=os.environ.get("SALVOR_TOKEN")) as run:
        print(f"run {run.run_id}", file=sys.stderr, flush=True)
        await run.start(agent=AGENT, input={"task": task})
        messages: list[dict] = [{"role": "user", "content": task}]
        while True:
            answer = await run.model_step(
                {"model": model, "max_tokens": 1024, "messages": messages, "tools": TOOLS}
            )
            blocks = answer["response"]["content"]
            messages.append({"role": "assistant", "content": blocks})
            uses = [b for b in blocks if b.get("type") == "tool_use"]
            if not uses:
                output = {
                    "reply": "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
                }
                await run.complete(output)
                return output
            results = []
            for use in uses:
                result = await run.client_tool(use["name"], use["input"], lookup_order)
                results.append(
                    {"type": "tool_result", "tool_use_id": use["id"], "content": json.dumps(result)}
                )
            messages.append({"role": "user", "content": results})


if __name__ == "__main__":
    url, prompt = sys.argv[1], sys.argv[2]
    print(json.dumps(anyio.run(drive, url, prompt, sys.argv[3] if len(sys.argv) > 3 else None)))
