"""graph.js in a real browser: a graph document drawn top to bottom, its node states from the run.

One headless Chromium for the module, on the harness page (``harness.py``). The picture is read
back from the DOM (each node's box, each edge's path), and the states come from the daemon's own
projection (``project_graph``) of a legal graph-run log, so the canvas reads what
``GET /v1/runs/{id}/graph`` answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from salvor.protocol import graph_from_value, project_graph
from selenium.webdriver.common.by import By

from tests.daemon.dashboard.harness import harness_page
from tests.protocol.graphs import publishing
from tests.support.browser import screenshot
from tests.support.graph_runs import GRAPH, legal, published

CONTRIB = Path(__file__).parents[3] / "contrib" / "graphs"
CONTRIB_GRAPHS = sorted(p for p in CONTRIB.glob("*.json") if not p.name.endswith(".input.json"))
PUBLISHING = publishing()
# published()'s seqs: 14 is the gate's Suspended, 26 the map's first item of two.
AT_THE_GATE = 15
ONE_ITEM_MAPPED = 26


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with harness_page(tmp_path_factory.mktemp("chromium")) as driver:
        yield driver


@pytest.fixture
def page(browser):
    """The harness's browser; after the test, no CSP refusal was recorded."""
    yield browser
    assert browser.execute_script("return window.harness.violations()") == []


def draw(driver, document: dict) -> None:
    driver.execute_script("window.harness.graph(arguments[0])", json.dumps(document))


def update(driver, node_states) -> None:
    driver.execute_script("window.harness.update(arguments[0])", json.dumps(node_states))


def projection(events: int | None = None, **run) -> dict:
    """The daemon's projection of the first ``events`` of published(), with ``run`` beside it."""
    log = legal(published())[:events]
    return {**project_graph(GRAPH, log, graph=graph_from_value(PUBLISHING)), **run}


def picture(driver) -> dict:
    """What is drawn: each node's box, texts and state; each edge's ends and points along it."""
    return driver.execute_script(
        """
        const nodes = {};
        for (const g of document.querySelectorAll('[data-node]')) {
          const box = g.querySelector('.sg-box');
          const number = (name) => Number(box.getAttribute(name));
          nodes[g.getAttribute('data-node')] = {
            x: number('x'), y: number('y'), width: number('width'), height: number('height'),
            texts: [...g.querySelectorAll('text')].map((t) => t.textContent),
            state: g.getAttribute('data-state'), classes: [...g.classList],
          };
        }
        const edges = [];
        for (const g of document.querySelectorAll('[data-edge]')) {
          const path = g.querySelector('.sg-edge-line');
          const tip = g.querySelector('.sg-arrowhead').getBBox();
          const length = path.getTotalLength();
          const points = [];
          for (let i = 0; i <= 40; i += 1) {
            const p = path.getPointAtLength((length * i) / 40);
            points.push([p.x, p.y]);
          }
          edges.push({
            from: g.getAttribute('data-from'), to: g.getAttribute('data-to'),
            case: g.getAttribute('data-case'), state: g.getAttribute('data-state'), points,
            tip: [tip.x + tip.width / 2, tip.y + tip.height],
          });
        }
        return { nodes, edges };
        """
    )


def inside(point, box, margin=1.0) -> bool:
    x, y = point
    return (
        box["x"] + margin < x < box["x"] + box["width"] - margin
        and box["y"] + margin < y < box["y"] + box["height"] - margin
    )


@pytest.mark.parametrize("path", CONTRIB_GRAPHS, ids=lambda path: path.stem)
def test_a_contrib_graph_draws_every_node_with_its_id_and_kind_and_every_edge(page, tmp_path, path):
    document = json.loads(path.read_text())
    draw(page, document)
    drawn = picture(page)
    assert set(drawn["nodes"]) == {node["id"] for node in document["nodes"]}
    for node in document["nodes"]:
        shown = drawn["nodes"][node["id"]]
        assert shown["texts"][0] == node["id"]
        assert shown["texts"][1].startswith(node["kind"])
        assert shown["state"] == "pending" and "sg-pending" in shown["classes"]
    edges = {(e["from"], e["to"]): e for e in drawn["edges"]}
    assert set(edges) == {(e["from"], e["to"]) for e in document["edges"]}
    for edge in document["edges"]:
        source, target = drawn["nodes"][edge["from"]], drawn["nodes"][edge["to"]]
        drawn_edge = edges[edge["from"], edge["to"]]
        start, line_end, tip = drawn_edge["points"][0], drawn_edge["points"][-1], drawn_edge["tip"]
        # From the middle of the source's bottom to the middle of the target's top, where the
        # arrowhead's tip touches it, the line ending at the arrowhead just above.
        assert start == pytest.approx(
            [source["x"] + source["width"] / 2, source["y"] + source["height"]]
        )
        assert tip == pytest.approx([target["x"] + target["width"] / 2, target["y"]])
        assert line_end[0] == pytest.approx(tip[0])
        assert 0 < tip[1] - line_end[1] <= 10
        assert source["y"] + source["height"] < target["y"]
        assert edges[edge["from"], edge["to"]]["case"] == edge.get("case")
    boxes = list(drawn["nodes"].values())
    for i, one in enumerate(boxes):
        for other in boxes[i + 1 :]:
            apart_x = (
                one["x"] + one["width"] <= other["x"] or other["x"] + other["width"] <= one["x"]
            )
            apart_y = (
                one["y"] + one["height"] <= other["y"] or other["y"] + other["height"] <= one["y"]
            )
            assert apart_x or apart_y, "two boxes overlap"
    screenshot(page, tmp_path, f"graph-{path.stem}")


def test_layers_are_the_longest_path_from_an_entry_node(page):
    draw(page, json.loads((CONTRIB / "publish.json").read_text()))
    row = {node: shown["y"] for node, shown in picture(page)["nodes"].items()}
    assert row["research"] < row["draft"] < row["approve"] < row["route"]
    assert row["route"] < row["publish"] == row["tell_author"]
    draw(page, PUBLISHING)
    row = {node: shown["y"] for node, shown in picture(page)["nodes"].items()}
    # The map and its fold are a second component, entered at the top beside research.
    assert row["each"] == row["research"] and row["tally"] == row["draft"]


def test_update_changes_states_in_place_from_the_projection(page, tmp_path):
    draw(page, PUBLISHING)
    svg = page.find_element(By.CSS_SELECTOR, "[data-test=graph]")
    approve = page.find_element(By.CSS_SELECTOR, '[data-node="approve"]')
    # Parked at the gate: the run waits on a person, so the gate it is in is waiting, not running.
    update(page, projection(AT_THE_GATE, run_state="suspended"))
    drawn = picture(page)
    states = {node: shown["state"] for node, shown in drawn["nodes"].items()}
    assert states == {
        "research": "completed",
        "draft": "completed",
        "approve": "waiting",
        "route": "pending",
        "publish": "pending",
        "cool_off": "pending",
        "each": "pending",
        "tally": "pending",
    }
    assert "sg-waiting" in drawn["nodes"]["approve"]["classes"]
    assert "sg-pending" not in drawn["nodes"]["approve"]["classes"]
    edges = {(e["from"], e["to"]): e["state"] for e in drawn["edges"]}
    assert edges["draft", "approve"] == "taken" and edges["approve", "route"] == "pending"
    screenshot(page, tmp_path, "graph-at-the-gate")
    # Nothing was redrawn: the elements a reader holds are the ones on the page.
    assert page.find_element(By.CSS_SELECTOR, "[data-test=graph]") == svg
    assert page.find_element(By.CSS_SELECTOR, '[data-node="approve"]') == approve
    assert approve.get_attribute("data-state") == "waiting"

    update(page, projection(ONE_ITEM_MAPPED))
    each = picture(page)["nodes"]["each"]
    assert (each["state"], each["texts"][-1]) == ("running", "1/2 items")

    update(page, projection())
    drawn = picture(page)
    states = {node: shown["state"] for node, shown in drawn["nodes"].items()}
    assert states == {
        **dict.fromkeys(("research", "draft", "approve", "route", "publish"), "completed"),
        "cool_off": "skipped",
        "each": "completed",
        "tally": "completed",
    }
    assert drawn["nodes"]["route"]["texts"][-1] == "→ true"
    assert drawn["nodes"]["each"]["texts"][-1] == "2/2 items"
    edges = {(e["from"], e["to"]): e["state"] for e in drawn["edges"]}
    assert edges["route", "publish"] == "taken" and edges["route", "cool_off"] == "skipped"
    assert page.find_element(By.CSS_SELECTOR, '[data-node="approve"]') == approve
    screenshot(page, tmp_path, "graph-completed")


def test_a_failed_run_marks_the_node_it_failed_in_and_a_plain_map_of_states_is_read(page):
    draw(page, PUBLISHING)
    update(page, projection(AT_THE_GATE, status={"state": "failed"}))
    assert (
        page.find_element(By.CSS_SELECTOR, '[data-node="approve"]').get_attribute("data-state")
        == "failed"
    )
    update(page, {"research": "exited", "draft": "running", "cool_off": {"state": "skipped"}})
    states = {node: shown["state"] for node, shown in picture(page)["nodes"].items()}
    assert (states["research"], states["draft"], states["cool_off"]) == (
        "completed",
        "running",
        "skipped",
    )
    # A snapshot, not a patch: a node no longer named is pending again.
    assert states["approve"] == "pending"


def _tools(*ids: str) -> list[dict]:
    return [{"id": node, "kind": "tool", "tool": "echo"} for node in ids]


def test_crossing_edges_are_uncrossed_and_a_long_edge_goes_round_the_boxes_it_passes(
    page, tmp_path
):
    crossed = {
        "schema_version": 1,
        "nodes": _tools("left", "right", "under_right", "under_left"),
        "edges": [{"from": "left", "to": "under_left"}, {"from": "right", "to": "under_right"}],
    }
    draw(page, crossed)
    nodes = picture(page)["nodes"]
    assert nodes["left"]["x"] < nodes["right"]["x"]
    assert nodes["under_left"]["x"] < nodes["under_right"]["x"]

    # a -> b -> c -> d, and a -> d over the two layers between.
    skipping = {
        "schema_version": 1,
        "nodes": _tools("a", "b", "c", "d"),
        "edges": [
            {"from": "a", "to": "b"},
            {"from": "b", "to": "c"},
            {"from": "c", "to": "d"},
            {"from": "a", "to": "d"},
        ],
    }
    draw(page, skipping)
    drawn = picture(page)
    long_edge = next(e for e in drawn["edges"] if (e["from"], e["to"]) == ("a", "d"))
    for point in long_edge["points"]:
        assert not inside(point, drawn["nodes"]["b"]) and not inside(point, drawn["nodes"]["c"])
    screenshot(page, tmp_path, "graph-long-edge")
