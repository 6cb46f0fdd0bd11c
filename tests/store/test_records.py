"""A run summary's JSON is written from ``SUMMARY_FIELDS``, the table the OpenAPI document's
``RunSummary`` is checked against: every key of it when the row decodes, the required ones alone
when it does not, and no key beyond the table either way."""

from __future__ import annotations

from salvor.store import SUMMARY_KEYS, SUMMARY_REQUIRED, RunSummary
from salvor.store._records import SUMMARY_FIELDS

AT = "2026-01-01T00:00:00.000000Z"


def test_a_whole_summary_writes_every_key_of_the_table_in_its_order() -> None:
    summary = RunSummary(
        run_id="r",
        event_count=3,
        first_recorded_at=AT,
        last_recorded_at=AT,
        status={"state": "running"},
        state="running",
        usage={"input_tokens": 1, "output_tokens": 2},
        step_count=1,
        agent_def_hash="sha256:" + "a" * 64,
        # (No run has both: the table's order is what this pins.)
        graph_hash="sha256:" + "c" * 64,
        labels={"env": "test"},
        driven_by="client",
        wake_at=None,
        pending={"kind": "model", "seq": 1, "request_hash": "sha256:" + "b" * 64},
    )
    body = summary.to_json()
    assert list(body) == [key for key, _ in SUMMARY_FIELDS]
    assert set(body) == SUMMARY_KEYS
    assert body["run"] == "r" and body["labels"] == {"env": "test"}


def test_a_degraded_summary_writes_the_required_keys_alone_and_no_labels_is_no_key() -> None:
    degraded = RunSummary(run_id="r", event_count=0, first_recorded_at=AT, last_recorded_at=AT)
    assert tuple(degraded.to_json()) == SUMMARY_REQUIRED
    unlabelled = RunSummary(
        run_id="r", event_count=0, first_recorded_at=AT, last_recorded_at=AT, labels={}
    )
    assert "labels" not in unlabelled.to_json()
