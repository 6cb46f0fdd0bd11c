"""``salvor fork``: the hazard refused with each write printed, the plan of a dry run, a fork that
proceeds, and ``--graph`` checked against the hash the origin recorded.

In-process (``main`` with the standard streams captured): a spawned ``salvor`` costs a second of
CPU, and what is tested here is the verb's sentences, exits and what it records. The origins are
hand-written graph-run logs (``tests.support.graph_runs``) of a graph whose agents this store
does not hold, so ``Runtime.drive`` is replaced here by one that records nothing and answers the
child's view: the verb is seen handing its child to the drive. The walk of a fork's child is the
walker's, tested over HTTP (``tests/daemon/api/test_forks.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from salvor.daemon.cli import _main as cli
from salvor.daemon.runs import Runtime
from salvor.protocol import EMPTY_VIEW, graph_from_value
from salvor.store import EventStore

from tests.protocol.graphs import chain, publishing
from tests.support.graph_runs import DRAFT_WRITE, PUBLISH_WRITE, agent_run, published

# Both backends: `salvor fork` works on whichever store it is pointed at.

ORIGIN = "6f1c2a52-6a7e-4d0e-9a52-3f7c2a9e0d11"
AGENT_RUN = "0b5c1a52-6a7e-4d0e-9a52-3f7c2a9e0d12"
GRAPH = graph_from_value(publishing())


@pytest.fixture
def salvor(store_url, monkeypatch, capsys):
    """Run ``salvor ARGS`` in this process: (exit status, stdout, stderr)."""
    monkeypatch.setenv("SALVOR_STORE", store_url)
    # It would make the test process itself undumpable for the rest of the session.
    monkeypatch.setattr(cli, "make_undumpable", lambda: None)
    driven: list[str] = []

    async def drive(self, run_id, *, agent=None, on_record=None):
        driven.append(run_id)
        return await self.reads.view(run_id)

    monkeypatch.setattr(Runtime, "drive", drive)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    run.driven = driven
    return run


def _origin(store_url: str, *, store_graph: bool = True) -> None:
    with EventStore.open(store_url) as store:
        store.append(ORIGIN, published(GRAPH.hash), EMPTY_VIEW)
        store.append(AGENT_RUN, agent_run(), EMPTY_VIEW)
        if store_graph:
            store.definitions.put_graph(
                GRAPH.hash, document=GRAPH.document, summary=GRAPH.summary()
            )


def _runs(store_url: str) -> list[str]:
    with EventStore.open(store_url) as store:
        return sorted(summary.run_id for summary in store.list_runs()[0])


def test_an_unacknowledged_write_is_refused_with_each_write_printed(salvor, store_url) -> None:
    _origin(store_url)
    code, out, err = salvor("fork", ORIGIN, "--from-node", "draft", "--acknowledge-writes", "8")
    assert code == 1 and out == ""
    printed, sentence = err.strip().splitlines()
    assert printed == f'seq {PUBLISH_WRITE}: publish_post {{"text": "draft one"}}'
    assert sentence.startswith(f"salvor: forking run {ORIGIN} from node 'draft' would re-execute 1")
    code, out, _ = salvor("fork", ORIGIN, "--from-node", "research", "--json")
    assert code == 1
    refusal = json.loads(out)["error"]
    assert refusal["code"] == "write_replay_hazard"
    assert [w["seq"] for w in refusal["details"]["writes"]] == [DRAFT_WRITE, PUBLISH_WRITE]
    assert _runs(store_url) == sorted([ORIGIN, AGENT_RUN])


def test_a_dry_run_prints_the_plan_and_records_nothing(salvor, store_url) -> None:
    _origin(store_url)
    code, out, _ = salvor("fork", ORIGIN, "--from-node", "approve", "--dry-run", "--json")
    assert code == 0
    plan = json.loads(out)
    assert (plan["through_seq"], plan["prefix_event_count"]) == (12, 13)
    assert plan["unacknowledged_writes"] == [PUBLISH_WRITE] and plan["would_proceed"] is False
    code, out, _ = salvor(
        "fork", ORIGIN, "--from-node", "approve", "--dry-run", "--acknowledge-writes", "all"
    )
    assert code == 0
    assert out.splitlines() == [
        (
            f"forking run {ORIGIN} from node 'approve' copies seq 0..12 (13 events) and re-walks "
            "the rest"
        ),
        f'  seq {PUBLISH_WRITE}: publish_post {{"text": "draft one"}} (acknowledged)',
        "it would proceed",
    ]
    assert _runs(store_url) == sorted([ORIGIN, AGENT_RUN])
    assert salvor.driven == []


def test_a_fork_prints_the_child_and_hands_it_to_the_drive(salvor, store_url) -> None:
    _origin(store_url)
    code, out, _ = salvor("fork", ORIGIN, "--from-node", "research", "--acknowledge-writes", "all")
    assert code == 0, out
    child, sentence = out.strip().splitlines()
    assert sentence == f"run {child} is running"
    assert salvor.driven == [child]
    with EventStore.open(store_url) as store:
        (head,) = store.read_log(child)
    assert head.event.forked_from == {
        "run_id": ORIGIN,
        "through_seq": 0,
        "from_node": "research",
        "graph_hash": GRAPH.hash,
        "acknowledged_writes": [DRAFT_WRITE, PUBLISH_WRITE],
    }
    code, out, _ = salvor("fork", ORIGIN, "--from-node", "each", "--json")
    assert code == 0
    assert json.loads(out.splitlines()[0])["forked_from"]["acknowledged_writes"] == []


def test_graph_re_supplies_the_origin_s_document_checked_by_its_hash(
    salvor, store_url, tmp_path: Path
) -> None:
    _origin(store_url, store_graph=False)
    fork = ("fork", ORIGIN, "--from-node", "publish", "--acknowledge-writes", str(PUBLISH_WRITE))
    code, _, err = salvor(*fork)
    assert code == 1 and f"no graph {GRAPH.hash[:40]}" in err
    other = tmp_path / "other.json"
    other.write_text(json.dumps(chain(2)))
    code, _, err = salvor(*fork, "--graph", str(other))
    assert code == 1 and "a fork reuses its origin's graph unchanged" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("schema_version: 1\nnodes: [\n")
    code, _, err = salvor(*fork, "--graph", str(broken))
    assert code == 1 and f"--graph {broken}: the graph document has 1 validation error" in err
    assert "line 3, column 1" in err
    with EventStore.open(store_url) as store:
        assert store.definitions.get_graph(GRAPH.hash) is None
    assert _runs(store_url) == sorted([ORIGIN, AGENT_RUN])

    document = tmp_path / "publishing.yaml"
    document.write_text(yaml.safe_dump(publishing(), sort_keys=False))
    code, out, err = salvor(*fork, "--graph", str(document))
    assert code == 0, err
    with EventStore.open(store_url) as store:
        assert store.definitions.get_graph(GRAPH.hash).document == publishing()
        assert len(store.read_log(out.splitlines()[0])) == PUBLISH_WRITE - 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((AGENT_RUN, "--from-node", "research"), "is an agent run, not a graph run"),
        ((ORIGIN, "--from-node", "cool_off"), "never entered node 'cool_off'"),
        ((ORIGIN, "--from-node", "publish", "--acknowledge-writes", "8"), "not a write the fork"),
    ],
)
def test_refusals_are_one_sentence(salvor, store_url, args, fragment) -> None:
    _origin(store_url)
    code, out, err = salvor("fork", *args)
    assert code == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("salvor: ") and fragment in line
    assert _runs(store_url) == sorted([ORIGIN, AGENT_RUN])


def test_a_bad_acknowledgement_is_a_usage_error(salvor, store_url) -> None:
    _origin(store_url)
    with pytest.raises(SystemExit) as exited:
        salvor("fork", ORIGIN, "--from-node", "publish", "--acknowledge-writes", "4,x")
    assert exited.value.code == 2
