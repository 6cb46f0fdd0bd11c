"""Property tests over random graph documents: a valid DAG is accepted and hashes stably, every
injected defect is reported in one answer, and validation never raises on any JSON value."""

from __future__ import annotations

import json
import random
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from salvor.protocol import (
    check_graph,
    graph_from_value,
    parse_graph_json,
    parse_graph_yaml,
    sha256_hash,
)

from tests.protocol.graphs import AGENT, publishing

# Modest: the suite's wall time is tight (issue 13); the whole module runs in a few seconds.
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KINDS = ("agent", "tool", "gate", "branch", "map", "fold", "delay")
# Text for names and values: any character JSON, RFC 8785 and both stores keep.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
NAMES = TEXT.filter(str.strip).map(lambda text: text[:64])


def _reference(draw, upstream: list[str]) -> str:
    if upstream and draw(st.booleans()):
        node = draw(st.sampled_from(upstream))
        return f"$nodes.{node}" + draw(st.sampled_from(["", ".out", ".0.items"]))
    return draw(st.sampled_from(["$input", "$input.topic", "$input.tickets.0"]))


# A template's shape is drawn once from this small strategy; each REF is then replaced by a
# reference to the run input or an ancestor, and (inside a map body) each ITEM by $item or $index.
REF, ITEM = "\x01ref", "\x01item"
SAFE_INTEGERS = st.integers(-(2**53) + 1, 2**53 - 1)
TEMPLATE_SHAPES = st.recursive(
    st.sampled_from([REF, ITEM, "$$5", "plain text", 7, 2.5, None, True]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc$"), inner),
    max_leaves=6,
)


def _template(draw, upstream: list[str], *, in_body: bool = False) -> Any:
    def fill(value: Any) -> Any:
        if value == REF or (value == ITEM and not in_body):
            return _reference(draw, upstream)
        if value == ITEM:
            return draw(st.sampled_from(["$item", "$item.id", "$index"]))
        if isinstance(value, list):
            return [fill(item) for item in value]
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        return value

    return fill(draw(TEMPLATE_SHAPES))


def _node_fields(draw, kind: str, upstream: list[str]) -> dict:
    if kind in ("agent", "tool"):
        fields = {"agent": AGENT} if kind == "agent" else {"tool": draw(NAMES)}
        if draw(st.booleans()):
            fields["input"] = _template(draw, upstream)
        return fields
    if kind == "gate":
        return {"prompt": draw(NAMES)} | draw(
            st.sampled_from([{}, {"approval_schema": {"type": "object", "required": ["ok"]}}])
        )
    if kind == "map":
        body = {"kind": "tool", "tool": "echo", "input": _template(draw, upstream, in_body=True)}
        return {"over": _reference(draw, upstream), "body": body} | draw(
            st.sampled_from([{}, {"concurrency": draw(st.integers(1, 64))}])
        )
    if kind == "fold":
        reducer = draw(st.sampled_from(["sum", "count", "concat", "merge", "collect"]))
        return {"over": _reference(draw, upstream), "reducer": reducer} | draw(
            st.sampled_from([{}, {"field": "a.b"}])
        )
    if draw(st.booleans()):
        return {"seconds": draw(st.floats(0.001, 365 * 24 * 3600) | st.integers(1, 86400))}
    return {"until": draw(st.sampled_from(["2031-02-03T04:05:06Z", "2031-02-03T04:05:06+02:00"]))}


@st.composite
def valid_graphs(draw, min_nodes: int = 1) -> dict:
    """A random DAG: edges only from a lower to a higher index, every kind, branches with a case
    on each of their edges, references only to ancestors."""
    count = draw(st.integers(min_nodes, 14))
    prefixes = draw(
        st.lists(
            st.from_regex(r"[a-y][A-Za-z0-9_-]{0,6}", fullmatch=True),
            min_size=count,
            max_size=count,
        )
    )
    ids = [f"{prefix}{index}" for index, prefix in enumerate(prefixes)]
    kinds = [draw(st.sampled_from(KINDS)) for _ in ids]
    kinds[-1] = kinds[-1] if kinds[-1] != "branch" else "tool"  # a branch needs an edge out
    edges: list[dict] = []
    ancestors: list[set[str]] = [set() for _ in ids]
    for target in range(1, count):
        sources = draw(st.sets(st.integers(0, target - 1), max_size=3))
        for source in sorted(sources):
            edges.append({"from": ids[source], "to": ids[target]})
            ancestors[target] |= ancestors[source] | {ids[source]}
    for index, kind in enumerate(kinds):
        out = [edge for edge in edges if edge["from"] == ids[index]]
        if kind == "branch" and not out:
            target = draw(st.integers(index + 1, count - 1))
            out.append({"from": ids[index], "to": ids[target]})
            edges.append(out[-1])
            for later in range(target, count):  # ancestors only grow; keep them a superset-free
                ancestors[later] |= {ids[index]} if later == target else set()
    nodes = []
    for index, (node_id, kind) in enumerate(zip(ids, kinds, strict=True)):
        upstream = sorted(ancestors[index])
        node = {"id": node_id, "kind": kind}
        if draw(st.booleans()):
            node["name"] = draw(NAMES)
        if kind == "branch":
            out = [edge for edge in edges if edge["from"] == node_id]
            cases = [f"c{number}" for number in range(len(out))]
            for edge, case in zip(out, cases, strict=True):
                edge["case"] = case
            node |= {"on": _reference(draw, upstream), "cases": cases}
            if draw(st.booleans()):
                node["default"] = draw(st.sampled_from(cases))
        else:
            node |= _node_fields(draw, kind, upstream)
        nodes.append(node)
    draw(st.randoms()).shuffle(edges)  # edge order is free
    return {"schema_version": 1, "nodes": nodes, "edges": edges}


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: _shuffled(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


@SETTINGS
@given(document=valid_graphs(), rng=st.randoms())
def test_a_random_dag_is_accepted_and_hashes_stably(document: dict, rng: random.Random) -> None:
    assert check_graph(document) == []
    graph = graph_from_value(document)
    assert graph.hash == sha256_hash(document)
    assert sorted(graph.order) == sorted(node["id"] for node in document["nodes"])
    position = {node_id: index for index, node_id in enumerate(graph.order)}
    assert all(position[edge.source] < position[edge.target] for edge in graph.edges)
    text = json.dumps(_shuffled(document, rng), ensure_ascii=rng.random() < 0.5)
    assert parse_graph_json(text).hash == graph.hash
    assert parse_graph_yaml(yaml.safe_dump(document, default_style='"')).hash == graph.hash


def _inject(document: dict, defect: str, rng: random.Random, first: int, second: int) -> None:
    nodes, edges = document["nodes"], document["edges"]
    if defect == "dangling_edge":
        edges.append({"from": nodes[first]["id"], "to": "zz missing"})
    elif defect == "duplicate_node_id":
        nodes.append({"id": nodes[first]["id"], "kind": "tool", "tool": "echo"})
    elif defect == "self_edge":
        edges.append({"from": nodes[first]["id"], "to": nodes[first]["id"]})
    elif defect == "cycle":
        low, high = nodes[min(first, second)]["id"], nodes[max(first, second)]["id"]
        if not any(edge["from"] == low and edge["to"] == high for edge in edges):
            edges.append({"from": low, "to": high})
        edges.append({"from": high, "to": low})
    elif defect == "blank_node_name":
        nodes[first]["name"] = " " * rng.randint(0, 3)
    elif defect == "node_name_too_long":
        nodes[second]["name"] = "x" * rng.randint(65, 200)
    else:
        nodes.append({"id": "zz_refers", "kind": "tool", "tool": "t", "input": ["$nodes.zz no"]})


DEFECTS = (
    "dangling_edge",
    "duplicate_node_id",
    "self_edge",
    "cycle",
    "blank_node_name",
    "node_name_too_long",
    "unknown_reference",
)


@SETTINGS
@given(
    document=valid_graphs(min_nodes=2),
    defects=st.lists(st.sampled_from(DEFECTS), min_size=1, max_size=4, unique=True),
    rng=st.randoms(),
)
def test_every_injected_defect_is_reported_in_one_answer(document, defects, rng) -> None:
    # Two different nodes: the two name defects go one on each.
    first, second = rng.sample(range(len(document["nodes"])), 2)
    for defect in defects:
        _inject(document, defect, rng, first, second)
    codes = {error.code for error in check_graph(document)}
    assert set(defects) <= codes


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)


@SETTINGS
@given(value=JSON_VALUES)
def test_validation_never_raises_on_any_json_value(value: Any) -> None:
    errors = check_graph(value)
    assert errors and all(error.code == "malformed_document" for error in errors)


FIELD_NAMES = st.sampled_from(
    [
        "id",
        "kind",
        "name",
        "input",
        "agent",
        "tool",
        "prompt",
        "approval_schema",
        "on",
        "cases",
        "default",
        "over",
        "body",
        "concurrency",
        "reducer",
        "field",
        "seconds",
        "until",
        "from",
        "to",
        "case",
    ]
)


@SETTINGS
@given(
    document=st.just(None).map(lambda _: publishing()),
    where=st.integers(0, 13),
    name=FIELD_NAMES,
    value=JSON_VALUES,
)
def test_validation_never_raises_on_a_document_with_one_field_replaced(
    document, where, name, value
) -> None:
    # Deeper than a random value reaches: a well-formed document with one field of one node
    # or edge (present or not) set to an arbitrary JSON value.
    places = document["nodes"] + document["edges"]
    places[where % len(places)][name] = value
    for error in check_graph(document):
        json.dumps(error.to_json())
