"""Benchmark: graph documents and graph runs (issue 15).

Two halves, one JSON object on stdout:

* ``validation``: ``parse_graph_json`` of a 10,000-node document (a chain
  with fan-out; agents, tools, gates, branches, maps, folds, delays, and
  references into the chain), best of several rounds, beside the same run's
  floor: ``json.loads`` of the same text, which any reader pays (wall
  clock, and the CPU time of the parse, which a busy machine inflates less).
  Target: under 1 s. ``--yaml`` adds ``parse_graph_yaml`` of the same document
  (pyyaml's pure-Python loader: informative, not a target).
* ``map``: a ``map`` (concurrency 64) over 1,000 items (``--items``) of a
  one-call agent (the demo model, in-process, no tools) in one graph run,
  from ``POST /v1/graph-runs`` until the run completed, beside the same
  1,000 one-call runs through ``POST /v1/runs`` (posted concurrently) until
  all completed, in one daemon on a fresh SQLite store. Target: the map's
  items/s at least the separate runs' runs/s.

Never a timed assertion (pytest does not collect this file: its name does
not start with ``test_``).

    python tests/bench/bench_graph.py [--nodes 10000] [--rounds 5] [--yaml] [--items 1000]
    [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import trio
import yaml
from salvor.daemon.serve._serve import ServeConfig, serve
from salvor.protocol import EventKind, parse_graph_json, parse_graph_yaml
from salvor.store import EventStore

TARGET_VALIDATION_S = 1.0
MAP_WIDTH = 64  # a map's largest concurrency, and as many runs driving at once beside it
POSTERS = 32  # concurrent POST /v1/runs in flight in the separate runs' arm
AGENT = "sha256:" + "c" * 64
# Node kinds by position in each run of ten: most of a real graph is agents and tools.
PATTERN = ("agent", "agent", "agent", "tool", "tool", "gate", "branch", "map", "fold", "delay")


def _node(index: int) -> dict:
    kind = PATTERN[index % len(PATTERN)]
    node: dict = {"id": f"n{index}", "kind": kind}
    previous = f"$nodes.n{index - 1}" if index else "$input"
    if index % 7 == 0:
        node["name"] = f"Step {index}"
    if kind == "agent":
        node |= {"agent": AGENT, "input": {"topic": "$input.topic", "notes": previous}}
        if index >= 40:
            node["input"]["earlier"] = [f"$nodes.n{index - 40}.summary", "$$literal"]
    elif kind == "tool":
        node |= {"tool": "lookup_invoice", "input": {"invoice": f"{previous}.invoice_id"}}
    elif kind == "gate":
        node |= {"prompt": "Go on?", "approval_schema": {"type": "object", "required": ["ok"]}}
    elif kind == "branch":
        node |= {"on": f"{previous}.ok", "cases": ["go", "skip"], "default": "skip"}
    elif kind == "map":
        body = {"kind": "tool", "tool": "triage", "input": {"ticket": "$item", "n": "$index"}}
        node |= {"over": "$input.tickets", "concurrency": 8, "body": body}
    elif kind == "fold":
        node |= {"over": previous, "reducer": "sum", "field": "minutes"}
    else:
        node["seconds"] = 5
    return node


def large_document(count: int) -> dict:
    """A chain n0 -> n1 -> ... where each branch takes ``go`` to the next node and ``skip`` one
    further, and every 50th node also fans out five ahead."""
    nodes = [_node(index) for index in range(count)]
    edges = []
    for index in range(count - 1):
        if nodes[index]["kind"] == "branch":
            edges.append({"from": f"n{index}", "to": f"n{index + 1}", "case": "go"})
            if index + 2 < count:
                edges.append({"from": f"n{index}", "to": f"n{index + 2}", "case": "skip"})
            continue
        edges.append({"from": f"n{index}", "to": f"n{index + 1}"})
        if index % 50 == 0 and index + 5 < count:
            edges.append({"from": f"n{index}", "to": f"n{index + 5}"})
    return {"schema_version": 1, "nodes": nodes, "edges": edges}


def best_seconds(fn, rounds: int, clock=time.perf_counter) -> tuple[float, list[float]]:
    times = []
    for _ in range(rounds):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times), times


def validation(nodes: int, rounds: int, with_yaml: bool) -> dict:
    document = large_document(nodes)
    text = json.dumps(document)
    graph = parse_graph_json(text)  # sanity: the document is valid and every node is ordered
    if len(graph.order) != nodes:
        raise SystemExit("bench_graph: the document did not validate as a whole")
    parse_s, parse_times = best_seconds(lambda: parse_graph_json(text), rounds)
    floor_s, floor_times = best_seconds(lambda: json.loads(text), rounds)
    # CPU time too: on a shared machine the wall clock also counts the time spent waiting for a
    # core, which the CPU clock does not.
    cpu_s = best_seconds(lambda: parse_graph_json(text), rounds, time.process_time)[0]
    result = {
        "nodes": nodes,
        "edges": len(document["edges"]),
        "document_bytes": len(text.encode()),
        "parse_graph_json_s": round(parse_s, 4),
        "parse_graph_json_cpu_s": round(cpu_s, 4),
        "json_loads_floor_s": round(floor_s, 4),
        "vs_floor": round(parse_s / floor_s, 1),
        "target_s": TARGET_VALIDATION_S,
        "meets_target": parse_s < TARGET_VALIDATION_S,
        "rounds_seconds": {
            "parse_graph_json": [round(t, 4) for t in parse_times],
            "json_loads": [round(t, 4) for t in floor_times],
        },
    }
    if with_yaml:
        yaml_text = yaml.safe_dump(document, sort_keys=False)
        if parse_graph_yaml(yaml_text).hash != graph.hash:
            raise SystemExit("bench_graph: the YAML twin hashes differently")
        result["parse_graph_yaml_s"] = round(
            best_seconds(lambda: parse_graph_yaml(yaml_text), 1)[0], 4
        )
    return result


AGENT_TOML = (
    'name = "bench-graph-item"\nmodel = "demo-planner"\n'
    'system_prompt = "Answer in one call."\n[llm]\nprovider = "demo"\n'
)


class Completions:
    """Wraps ``EventStore.append_batch`` (production code unchanged) to hear each ``RunCompleted``
    as the writer commits it: how many runs completed, and which; and every event committed (so
    the output shows each item cost the same events in both arms)."""

    def __init__(self) -> None:
        self.count = 0
        self.events = 0
        self.runs: set[str] = set()
        self._lock = threading.Lock()
        self._real = EventStore.append_batch

    def install(self) -> None:
        completions = self

        def append_batch(store, requests):
            results = completions._real(store, requests)
            for result in results:
                if isinstance(result, tuple):
                    with completions._lock:
                        completions.events += len(result[0])
                    last = result[0][-1]
                    if last.event.KIND is EventKind.RUN_COMPLETED:
                        with completions._lock:
                            completions.count += 1
                            completions.runs.add(last.run_id)
            return results

        EventStore.append_batch = append_batch

    def uninstall(self) -> None:
        EventStore.append_batch = self._real


async def _until(condition) -> None:
    while not condition():
        await trio.sleep(0.005)


async def _map_and_runs(url: str, items: int, completions: Completions) -> dict:
    config = ServeConfig(port=0, store_url=url, wake_interval=0, recovery_concurrency=MAP_WIDTH)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, config)
        async with httpx.AsyncClient(
            base_url=binds[0], timeout=120, limits=httpx.Limits(max_connections=64)
        ) as client:
            answer = await client.post(
                "/v1/agents", content=AGENT_TOML, headers={"content-type": "application/toml"}
            )
            answer.raise_for_status()
            agent = answer.json()["agent"]
            document = {
                "schema_version": 1,
                "nodes": [
                    {
                        "id": "each",
                        "kind": "map",
                        "over": "$input.items",
                        "concurrency": MAP_WIDTH,
                        "body": {"kind": "agent", "agent": agent, "input": {"task": "$item"}},
                    }
                ],
                "edges": [],
            }
            answer = await client.post("/v1/graphs", json=document)
            answer.raise_for_status()
            graph = answer.json()["graph"]
            tasks = [f"item {i}" for i in range(items)]

            # (a) one graph run: its map drives every item as a child run.
            before, events_before = completions.count, completions.events
            start = time.perf_counter()
            answer = await client.post(
                "/v1/graph-runs", json={"graph_hash": graph, "input": {"items": tasks}}
            )
            answer.raise_for_status()
            graph_run = answer.json()["run"]
            await _until(lambda: graph_run in completions.runs)
            map_wall = time.perf_counter() - start
            children = completions.count - before - 1
            map_events = completions.events - events_before
            view = (await client.get(f"/v1/runs/{graph_run}/graph")).json()
            (each,) = view["nodes"]

            # (b) the same items as separate runs, posted as fast as a client can: POSTERS
            # workers, each with a client (one kept-alive connection) of its own, take the next
            # item until none is left. One shared pool of 64 connections would cost this process
            # (the daemon's too) more than the daemon's work: httpcore scans every connection of
            # the pool for each request it places (seen under cProfile).
            before, events_before = completions.count, completions.events
            left = iter(tasks)
            # Opened before the clock starts: each client loads the CA bundle when it is made
            # (some 30 ms each), which is not the daemon's work.
            async with contextlib.AsyncExitStack() as opened:
                own_clients = [
                    await opened.enter_async_context(
                        httpx.AsyncClient(base_url=binds[0], timeout=120)
                    )
                    for _ in range(POSTERS)
                ]

                async def poster(own: httpx.AsyncClient) -> None:
                    for task in left:
                        reply = await own.post(
                            "/v1/runs", json={"agent": agent, "input": {"task": task}}
                        )
                        reply.raise_for_status()

                start = time.perf_counter()
                async with trio.open_nursery() as posters:
                    for own in own_clients:
                        posters.start_soon(poster, own)
                runs_created = time.perf_counter() - start
            await _until(lambda: completions.count - before >= items)
            runs_wall = time.perf_counter() - start
            runs_events = completions.events - events_before
        nursery.cancel_scope.cancel(reason="benchmark done")
    map_rate, runs_rate = items / map_wall, items / runs_wall
    return {
        "items": items,
        "model": "demo (in-process, one call, no tools)",
        "map_concurrency": MAP_WIDTH,
        "drive_concurrency": MAP_WIDTH,
        "map_seconds": round(map_wall, 3),
        "map_items_per_s": round(map_rate, 1),
        "map_children_completed": children,
        "map_node": each.get("map"),
        "map_events": map_events,
        "runs_seconds": round(runs_wall, 3),
        "runs_create_seconds": round(runs_created, 3),
        "runs_posters": POSTERS,
        "runs_per_s": round(runs_rate, 1),
        "runs_events": runs_events,
        "map_vs_runs": round(map_rate / runs_rate, 3),
        "meets_target": map_rate >= runs_rate,
    }


def map_versus_runs(items: int, directory: Path | None = None) -> dict:
    """Items/s of a ``map`` (concurrency 64) over ``items`` one-call agent items, from ``POST
    /v1/graph-runs`` until the graph run completed, beside the same items as separate runs
    through ``POST /v1/runs`` until all completed: one daemon (``serve()`` in this process on a
    loopback port) on a fresh SQLite store. Target: the map at least as fast."""
    completions = Completions()
    with tempfile.TemporaryDirectory(dir=directory, prefix="salvor-bench-graph-") as scratch:
        completions.install()
        try:
            return trio.run(_map_and_runs, f"sqlite:///{scratch}/bench.db", items, completions)
        finally:
            completions.uninstall()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--yaml", action="store_true", help="also time parse_graph_yaml")
    parser.add_argument("--items", type=int, default=1000, help="the map's items (and runs)")
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite store goes")
    args = parser.parse_args()
    results = {
        "bench": "graph",
        "validation": validation(args.nodes, args.rounds, args.yaml),
        "map": map_versus_runs(args.items, args.dir),
        "python": sys.version.split()[0],
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
