"""Agent definitions and graph documents in the store on real databases: kept once, as submitted."""

from __future__ import annotations

import json

import pytest
from salvor.store import EventStore

from tests.support.store_records import GRAPH_DOCUMENT, GRAPH_SUMMARY

# -- agents -----------------------------------------------------------------------


def test_agents_are_stored_once_and_verbatim(store: EventStore) -> None:
    definition = 'model = "m"\nname = "triage"\n'
    assert store.definitions.put_agent(
        "sha256:1", format="toml", definition=definition, name="triage"
    )
    assert not store.definitions.put_agent("sha256:1", format="toml", definition="other", name=None)
    assert store.definitions.put_agent(
        "sha256:2", format="json", definition='{"model":"m"}', name=None
    )
    markdown = "---\nname: triage\nmodel: m\n---\nTriage.\n"
    assert store.definitions.put_agent("sha256:5", format="md", definition=markdown, name="triage")
    assert (
        store.definitions.get_agent("sha256:5").format,
        store.definitions.get_agent("sha256:5").definition,
    ) == (
        "md",
        markdown,
    )
    agent = store.definitions.get_agent("sha256:1")
    assert (agent.format, agent.definition, agent.name) == ("toml", definition, "triage")
    assert store.definitions.get_agent("sha256:2").name is None
    assert store.definitions.get_agent("sha256:3") is None
    assert [a.agent_def_hash for a in store.definitions.list_agents()] == [
        "sha256:1",
        "sha256:2",
        "sha256:5",
    ]
    with pytest.raises(ValueError, match="toml"):
        store.definitions.put_agent("sha256:4", format="yaml", definition="", name=None)


# -- graphs -------------------------------------------------------------------------


def test_graphs_are_stored_once_and_as_submitted(store: EventStore) -> None:
    assert store.definitions.put_graph("sha256:g1", document=GRAPH_DOCUMENT, summary=GRAPH_SUMMARY)
    assert not store.definitions.put_graph(
        "sha256:g1", document={"other": True}, summary={**GRAPH_SUMMARY, "node_count": 9}
    )
    other = {**GRAPH_SUMMARY, "entry_nodes": ["a", "b"], "terminal_nodes": []}
    assert store.definitions.put_graph("sha256:g2", document={"n": [1.5, "ü"]}, summary=other)
    stored = store.definitions.get_graph("sha256:g1")
    assert stored.document == GRAPH_DOCUMENT
    assert json.dumps(stored.document) == json.dumps(GRAPH_DOCUMENT)  # key order too
    assert store.definitions.get_graph("sha256:g2").document == {"n": [1.5, "ü"]}
    assert store.definitions.get_graph("sha256:g3") is None
    listed = store.definitions.list_graphs()
    assert [g.graph_hash for g in listed] == ["sha256:g1", "sha256:g2"]
    assert [g.summary() for g in listed] == [GRAPH_SUMMARY, other]
    assert listed[0].created_at == stored.created_at


def test_a_graph_with_a_summary_of_another_shape_is_a_misuse(store: EventStore) -> None:
    with pytest.raises(ValueError, match="entry_nodes"):
        store.definitions.put_graph("sha256:g1", document={}, summary={"node_count": 1})
    assert store.definitions.list_graphs() == []


def test_graphs_survive_reopening_the_store(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        store.definitions.put_graph("sha256:g1", document=GRAPH_DOCUMENT, summary=GRAPH_SUMMARY)
    with EventStore.open(store_url) as store:
        assert store.definitions.get_graph("sha256:g1").document == GRAPH_DOCUMENT
        assert [g.summary() for g in store.definitions.list_graphs()] == [GRAPH_SUMMARY]
