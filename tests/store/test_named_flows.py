"""Flows kept by name: a new version only when the graph changes, every version kept, the
listing at each name's current version; a version-10 store gains the table."""

from __future__ import annotations

from salvor.store import STORE_VERSION, EventStore, Naming

from tests.store.test_store import execute_sql


def test_naming_a_flow_again_makes_a_version_only_for_another_graph(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        flows = store.named_flows
        assert flows.name("team", "triage", "sha256:a", run_id="run-1") == Naming(1, True)
        assert flows.name("team", "triage", "sha256:a", run_id="run-2") == Naming(1, False)
        assert flows.name("team", "triage", "sha256:b", run_id=None) == Naming(2, True)
        # Back to the first graph: the current one differs, so a third version.
        assert flows.name("team", "triage", "sha256:a", run_id=None) == Naming(3, True)
        versions = flows.versions("team", "triage")
        assert [(v.version, v.graph_hash, v.run_id) for v in versions] == [
            (1, "sha256:a", "run-1"),
            (2, "sha256:b", None),
            (3, "sha256:a", None),
        ]
        assert flows.current("team", "triage").version == 3
        assert flows.current("team", "other") is None
        assert flows.versions("other", "triage") == []


def test_the_listing_shows_each_name_at_its_current_version(store_url: str) -> None:
    with EventStore.open(store_url) as store:
        flows = store.named_flows
        flows.name("b", "one", "sha256:x", run_id=None)
        flows.name("a", "two", "sha256:y", run_id=None)
        flows.name("a", "two", "sha256:z", run_id=None)
        listed = [(f.namespace, f.name, f.version, f.graph_hash) for f in flows.list()]
        assert listed == [("a", "two", 2, "sha256:z"), ("b", "one", 1, "sha256:x")]
        assert flows.list()[0].updated_at == flows.versions("a", "two")[-1].created_at


def test_a_version_10_store_gains_the_flow_versions_table(store_url: str) -> None:
    EventStore.open(store_url).close()
    execute_sql(store_url, "DROP TABLE flow_versions")
    execute_sql(store_url, "UPDATE store_meta SET value = 10")
    with EventStore.open(store_url) as store:
        assert store.named_flows.name("ns", "f", "sha256:a", run_id=None).version == 1
    assert STORE_VERSION >= 11
