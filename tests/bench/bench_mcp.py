"""Benchmark: latency an MCP stand-in adds to one ``tools/call``.

The same client (salvor's own MCP session, under trio) makes ``--calls``
``tools/call`` requests of the fixture server's ``lookup`` tool, first to the
server spawned directly over stdio, then through the stdio stand-in a process
agent would spawn (``python -m salvor.daemon.standin``): the relay posts
each message to the run's lane on the loopback proxy, which records the call
write-ahead in a real store (``ToolCallRequested``, then
``ToolCallCompleted``) and forwards it to the real server it runs itself.
Overhead = stand-in percentile minus direct percentile.

Target: p50 overhead <= 3 ms. Prints one JSON object; never a timed assertion.

    python tests/bench/bench_mcp.py [--calls 1000] [--dir DIR] [--store URL]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000, 3)


async def _timed_calls(session, calls: int) -> list[float]:
    times = []
    for i in range(calls):
        began = time.perf_counter()
        await session.call_tool("lookup", {"key": f"k{i}"})
        times.append(time.perf_counter() - began)
    return times


async def run(calls: int, store_url: str, scratch: Path) -> dict:
    from salvor.daemon.agents._definition import parse_definition
    from salvor.daemon.mcp._client import open_session
    from salvor.daemon.mcp._definition import McpServerSpec
    from salvor.daemon.proxies import ProxySession, open_model_proxy
    from salvor.daemon.proxies._mcp_lane import open_lanes
    from salvor.daemon.recording._run_context import RunContext
    from salvor.daemon.recording._store_access import open_store_access
    from salvor.daemon.runs._runtime import Runtime
    from salvor.daemon.tools._registry import ToolRegistry

    from tests.support.mcp_servers import FixtureServer

    fx = FixtureServer(scratch / "fx")
    fx.dir.mkdir(exist_ok=True)
    command = json.dumps(fx.command())
    agent = parse_definition(
        f'kind = "process"\ncommand = "true"\n[[mcp_servers]]\nname = "fix"\ncommand = {command}\n'
        'effects = { lookup = "read" }\n',
        "toml",
    )
    direct_spec = McpServerSpec(name="direct", command=tuple(fx.command()))
    results: dict = {"calls": calls}
    async with (
        open_store_access(store_url) as access,
        open_model_proxy() as proxy,
        trio.open_nursery() as nursery,
    ):
        session = await open_session(direct_spec, nursery, os.environ)
        try:
            direct = await _timed_calls(session, calls)
        finally:
            await session.aclose()
        runtime = Runtime(access, ToolRegistry(), proxy=proxy)
        run_id = await runtime.starts.start_run(agent, "bench")
        log = await runtime.reads.log(run_id)
        proxied_session = ProxySession(
            RunContext(access, run_id, log),
            log,
            record_prompts=False,
            upstream=None,
            client=proxy.client,
        )
        async with open_lanes(
            proxied_session, agent.mcp_servers, log, None, environ=os.environ, mark={}
        ) as lanes:
            url = f"{proxy.base(proxy.attach(proxied_session))}/mcp/fix"
            relay = McpServerSpec(
                name="stand-in", command=(sys.executable, "-m", "salvor.daemon.standin", url)
            )
            session = await open_session(relay, nursery, os.environ)
            try:
                through = await _timed_calls(session, calls)
            finally:
                await session.aclose()
            recorded = lanes["fix"].position
        nursery.cancel_scope.cancel()
    results.update(
        {
            "direct_p50_ms": _pct(direct, 50),
            "direct_p99_ms": _pct(direct, 99),
            "standin_p50_ms": _pct(through, 50),
            "standin_p99_ms": _pct(through, 99),
            "overhead_p50_ms": round(_pct(through, 50) - _pct(direct, 50), 3),
            "overhead_p99_ms": round(_pct(through, 99) - _pct(direct, 99), 3),
            "recorded_calls": recorded,
        }
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench_mcp_"))
    store_url = args.store or f"sqlite:///{scratch / 'salvor.db'}"
    print(json.dumps(trio.run(run, args.calls, store_url, scratch), indent=2))


if __name__ == "__main__":
    main()
