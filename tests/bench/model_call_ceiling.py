"""The model-call ceiling: how many model calls per second plain clients get, no salvor at all.

A sample is one short measurement: fresh scripted providers (as salvor's rounds have), and
``processes`` client processes, each with ``concurrency`` httpx clients of its own (one per
drive, as a salvor worker has), posting the same Anthropic request until their share of
``calls`` is answered. Each client is made and makes one untimed call first (a salvor worker
keeps its clients and their connections between drives; making 128 clients, each with its TLS
context, costs seconds of CPU that a short sample must not count). Then the client processes
start together on one event, and the sample's rate is the calls over the wall time from that
event to the last answer. Each client process reports its own CPU seconds, so a sample says
what bounded it.

Why a process per salvor worker: one Python process of httpx clients is bound by its one
core well before the providers are (about a millisecond of CPU per call), so a single client
process against a daemon of two workers measured that process, not the model round trip.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time

import httpx
import trio

from tests.bench.providers import ProviderProcesses

# The request every client posts: what a bench run's first model call sends.
BODY = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 256,
    "system": "You look up invoices, one at a time.",
    "messages": [{"role": "user", "content": "batch 0"}],
    "tools": [
        {
            "name": "lookup_invoice",
            "description": "Look up an invoice.",
            "input_schema": {
                "type": "object",
                "properties": {"invoice_id": {"type": "string"}},
            },
        }
    ],
}
HEADERS = {"x-api-key": "bench", "anthropic-version": "2023-06-01"}


async def direct_model_calls(base_urls: list[str], calls: int, concurrency: int, go, results):
    """``calls`` model calls from ``concurrency`` httpx clients in this process, each client
    posting to one provider (spread over ``base_urls``) one call after another.

    The clients are made and each has made one call (its connection open, as a salvor worker's
    kept clients have) before this process tells ``results`` it is ready and waits for ``go``;
    then it sends the CPU seconds the timed calls took.
    """
    left = [calls]

    async def call(client: httpx.AsyncClient, base_url: str) -> None:
        response = await client.post(f"{base_url}/v1/messages", json=BODY, headers=HEADERS)
        response.raise_for_status()
        response.json()

    async def worker(client: httpx.AsyncClient, base_url: str) -> None:
        while left[0] > 0:
            left[0] -= 1
            await call(client, base_url)

    async with contextlib.AsyncExitStack() as stack:
        clients = [
            (
                await stack.enter_async_context(httpx.AsyncClient(timeout=60)),
                base_urls[i % len(base_urls)],
            )
            for i in range(concurrency)
        ]
        async with trio.open_nursery() as nursery:
            for client, base_url in clients:
                nursery.start_soon(call, client, base_url)
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
