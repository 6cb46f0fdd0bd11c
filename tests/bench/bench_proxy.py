"""Benchmark: latency the loopback model proxy adds to one model call.

One client (httpx under trio, the same process as the proxy) makes ``--calls``
OpenAI Chat Completions calls, each with a body of its own, first straight to
the scripted provider (in a process of its own), then through the proxy
mounted for one process run over a real store, so every call through the
proxy is recorded live (``ModelCallRequested`` before forwarding, then
``ModelCallCompleted``). Non-streaming: the whole exchange; streaming: time to
the first byte of the body. Overhead = proxy percentile minus direct
percentile.

Target: p50 overhead <= 2 ms. Prints one JSON object; never a timed assertion.

    python tests/bench/bench_proxy.py [--calls 1000] [--dir DIR] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import trio


def _provider(queue) -> None:
    from tests.support.scripted_provider import ScriptedProvider, text_reply

    provider = ScriptedProvider(lambda call: text_reply("ok"))
    queue.put(provider.base_url)
    time.sleep(10**6)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000, 3)


async def _timed(client: httpx.AsyncClient, url: str, body: dict, stream: bool) -> float:
    began = time.perf_counter()
    if not stream:
        reply = await client.post(url, json=body)
        reply.raise_for_status()
        return time.perf_counter() - began
    async with client.stream("POST", url, json={**body, "stream": True}) as reply:
        reply.raise_for_status()
        elapsed = None
        async for _ in reply.aiter_raw():
            if elapsed is None:
                elapsed = time.perf_counter() - began
    return elapsed


async def run(calls: int, store_url: str, provider_url: str) -> dict:
    from salvor.daemon.agents._definition import parse_definition
    from salvor.daemon.proxies import ProxySession, open_model_proxy
    from salvor.daemon.proxies._upstream import Upstream
    from salvor.daemon.recording._run_context import RunContext
    from salvor.daemon.recording._store_access import open_store_access
    from salvor.daemon.runs._runtime import Runtime
    from salvor.daemon.tools._registry import ToolRegistry

    agent = parse_definition('kind = "process"\ncommand = "true"\n', "toml")
    results: dict = {"calls": calls}
    async with open_store_access(store_url) as access, open_model_proxy() as proxy:
        runtime = Runtime(access, ToolRegistry(), proxy=proxy)
        async with httpx.AsyncClient(timeout=30) as client:
            for stream in (False, True):
                run_id = await runtime.starts.start_run(agent, "bench")
                log = await runtime.reads.log(run_id)
                session = ProxySession(
                    RunContext(access, run_id, log),
                    log,
                    record_prompts=False,
                    upstream=Upstream(base_url=provider_url, api_key="k"),
                    client=proxy.client,
                )
                base = proxy.base(proxy.attach(session))
                direct, proxied = [], []
                for i in range(calls):
                    body = {"model": "m", "messages": [{"role": "user", "content": f"call {i}"}]}
                    direct.append(
                        await _timed(client, f"{provider_url}/v1/chat/completions", body, stream)
                    )
                    proxied.append(
                        await _timed(client, f"{base}/v1/chat/completions", body, stream)
                    )
                name = "stream_ttfb" if stream else "non_stream"
                results[name] = {
                    "direct_p50_ms": _pct(direct, 50),
                    "direct_p99_ms": _pct(direct, 99),
                    "proxy_p50_ms": _pct(proxied, 50),
                    "proxy_p99_ms": _pct(proxied, 99),
                    "overhead_p50_ms": round(_pct(proxied, 50) - _pct(direct, 50), 3),
                    "overhead_p99_ms": round(_pct(proxied, 99) - _pct(direct, 99), 3),
                    "recorded_calls": len(session.calls),
                }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench_proxy_"))
    store_url = args.store or f"sqlite:///{scratch / 'salvor.db'}"
    queue = multiprocessing.get_context("spawn").Queue()
    provider = multiprocessing.get_context("spawn").Process(
        target=_provider, args=(queue,), daemon=True
    )
    provider.start()
    try:
        provider_url = queue.get(timeout=30)
        print(json.dumps(trio.run(run, args.calls, store_url, provider_url), indent=2))
    finally:
        provider.terminate()


if __name__ == "__main__":
    main()
