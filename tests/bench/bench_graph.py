"""Benchmark: graph documents and graph runs (issue 15).

Two halves, one JSON object on stdout:

* ``validation``: ``parse_graph_json`` of a 10,000-node document (a chain
  with fan-out; agents, tools, gates, branches, maps, folds, delays, and
  references into the chain), best of several rounds, beside the same run's
  floor: ``json.loads`` of the same text, which any reader pays (wall
  clock, and the CPU time of the parse, which a busy machine inflates less).
  Target: under 1 s. ``--yaml`` adds ``parse_graph_yaml`` of the same document
  (pyyaml's pure-Python loader: informative, not a target).
* ``map``: a ``map`` over 1,000 items of a one-call agent node beside the
  same 1,000 one-call agent runs through ``POST /v1/runs``. Not written yet:
  see ``map_versus_runs`` below.

Never a timed assertion (pytest does not collect this file: its name does
not start with ``test_``).

    python tests/bench/bench_graph.py [--nodes 10000] [--rounds 5] [--yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml
from salvor.protocol import parse_graph_json, parse_graph_yaml

TARGET_VALIDATION_S = 1.0
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


def map_versus_runs() -> dict | None:
    """The other half: items/s of a ``map`` over 1,000 one-call agent items beside 1,000 one-call
    runs through ``POST /v1/runs`` in the same daemon and store. To be written with the graph-run
    engine; None until then."""
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--yaml", action="store_true", help="also time parse_graph_yaml")
    args = parser.parse_args()
    results = {
        "bench": "graph",
        "validation": validation(args.nodes, args.rounds, args.yaml),
        "map": map_versus_runs(),
        "python": sys.version.split()[0],
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
