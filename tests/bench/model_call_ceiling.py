"""The model-call ceiling: how many model calls per second plain clients get, no salvor at all.

A sample is one short measurement: fresh scripted providers (as salvor's rounds have), and
``processes`` client processes, each with ``concurrency`` httpx clients of its own (one per
drive, as a salvor worker has), each holding a bench run's conversation with its provider
(``direct_model_calls``) until their share of ``calls`` is answered. Each client is made and
makes one untimed call first (a salvor worker keeps its clients and their connections between
drives; making 128 clients, each with its TLS context, costs seconds of CPU that a short
sample must not count). Then the client processes start together on one event, and the
sample's rate is the calls over the wall time from that event to the last answer. Each client
process reports its own CPU seconds, so a sample says what bounded it.

Why a process per salvor worker: one Python process of httpx clients is bound by its one
core well before the providers are (about a millisecond of CPU per call), so a single client
process against a daemon of two workers measured that process, not the model round trip.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time

import httpx
import trio

from tests.bench.providers import ProviderProcesses

# What every call carries besides the conversation: a bench run's agent, its one tool.
REQUEST = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 256,
    "system": "You look up invoices, one at a time.",
    "tools": [
        {
            "name": "lookup_invoice",
            "description": "Look up an invoice.",
            "input_schema": {
                "type": "object",
                "required": ["invoice_id"],
                "properties": {"invoice_id": {"type": "string", "minLength": 1}},
            },
        }
    ],
}
HEADERS = {"x-api-key": "bench", "anthropic-version": "2023-06-01"}


def tool_results(content: list) -> list[dict]:
    """The user turn answering a reply's tool calls, as a bench run's agent answers
    ``lookup_invoice`` (the demo tool's output, as JSON text)."""
    results = []
    for block in content:
        if block.get("type") == "tool_use":
            invoice_id = str(block["input"].get("invoice_id", ""))
            output = {
                "amount_cents": 4321,
                "customer_email": f"billing+{invoice_id.lower()}@example.com",
                "invoice_id": invoice_id,
                "status": "paid",
            }
            results.append(
                {"type": "tool_result", "tool_use_id": block["id"], "content": json.dumps(output)}
            )
    return results


async def direct_model_calls(base_urls: list[str], calls: int, concurrency: int, go, results):
    """``calls`` model calls from ``concurrency`` httpx clients in this process, each client
    holding with one provider (spread over ``base_urls``) the conversation a bench run's agent
    holds: its task, then each reply's tool calls answered, until a reply calls no tool; then
    the next conversation. So the calls carry the same bytes as salvor's, growing with the
    conversation, and the providers answer the same script.

    The clients are made and each has made one call (its connection open, as a salvor worker's
    kept clients have) before this process tells ``results`` it is ready and waits for ``go``;
    then it sends the CPU seconds the timed calls took.
    """
    left = [calls]

    async def call(client: httpx.AsyncClient, base_url: str, messages: list) -> list:
        body = {**REQUEST, "messages": messages}
        response = await client.post(f"{base_url}/v1/messages", json=body, headers=HEADERS)
        response.raise_for_status()
        return response.json()["content"]

    async def worker(client: httpx.AsyncClient, base_url: str) -> None:
        task = [{"role": "user", "content": json.dumps({"task": "batch 0"})}]
        messages = task
        while left[0] > 0:
            left[0] -= 1
            content = await call(client, base_url, messages)
            answers = tool_results(content)
            if answers:
                messages = [
                    *messages,
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": answers},
                ]
            else:
                messages = task

    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for index in range(concurrency):
            client = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
            clients.append((client, base_urls[index % len(base_urls)]))
        async with trio.open_nursery() as nursery:
            for client, base_url in clients:
                nursery.start_soon(call, client, base_url, [{"role": "user", "content": "warm"}])
        results.send("ready")
        await trio.to_thread.run_sync(go.wait)
        before = os.times()
        async with trio.open_nursery() as nursery:
            for client, base_url in clients:
                nursery.start_soon(worker, client, base_url)
        after = os.times()
    results.send((after.user + after.system) - (before.user + before.system))
    results.close()


def _client_process(base_urls, calls, concurrency, go, results) -> None:
    trio.run(direct_model_calls, base_urls, calls, concurrency, go, results)


def sample(plan, providers: int, calls: int, processes: int, concurrency: int) -> dict:
    """One ceiling sample: ``calls`` model calls against ``providers`` fresh scripted providers
    answering ``plan``, from ``processes`` client processes of ``concurrency`` clients each.

    Returns the calls per second and the CPU milliseconds per call of the clients and of the
    providers.
    """
    context = multiprocessing.get_context("fork")
    with ProviderProcesses(plan, providers) as direct:
        go = context.Event()
        pipes, children = [], []
        for index in range(processes):
            share = calls // processes + (index < calls % processes)
            receiving, sending = context.Pipe(duplex=False)
            child = context.Process(
                target=_client_process,
                args=(direct.base_urls, share, concurrency, go, sending),
                daemon=True,
            )
            child.start()
            sending.close()
            pipes.append(receiving)
            children.append(child)
        try:
            for pipe in pipes:
                pipe.recv()
            provider_cpu = -direct.cpu_seconds()
            start = time.perf_counter()
            go.set()
            client_cpu = sum(pipe.recv() for pipe in pipes)
            wall = time.perf_counter() - start
            provider_cpu += direct.cpu_seconds()
        finally:
            for child in children:
                child.join(timeout=30)
                if child.is_alive():
                    child.kill()
        answered = direct.stop()
    if answered != calls + processes * concurrency:
        raise RuntimeError(f"the providers answered {answered} calls of {calls} (and the warm-ups)")
    return {
        "calls_per_s": round(calls / wall, 1),
        "client_cpu_ms_per_call": round(client_cpu / calls * 1000, 3),
        "provider_cpu_ms_per_call": round(provider_cpu / calls * 1000, 3),
    }
