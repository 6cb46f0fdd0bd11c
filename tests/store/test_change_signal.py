"""What a store tells other processes of its commits: PostgreSQL's notices (one per append
transaction, naming each run and its last seq, only once committed, on a channel per schema) and
SQLite's data_version watch with the one-query event counts."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from salvor.protocol import EMPTY_VIEW, RandomObserved, RunStarted
from salvor.store import AppendRequest, EventStore, SeqConflict
from salvor.store._change_signal import (
    ANY_RUN,
    NOTICE_LIMIT_BYTES,
    notice_payloads,
    parse_notice,
)

from tests.conftest import POSTGRES_ENV, _postgres_schema_url

AGENT = "sha256:" + "ab" * 32


def started() -> RunStarted:
    return RunStarted(agent_def_hash=AGENT, input=None)


def run_id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


# -- payloads --------------------------------------------------------------------------------------


def test_payloads_stay_under_the_servers_limit_and_name_every_run() -> None:
    moved = [(run_id(n), n * 1000) for n in range(1000)]
    payloads = notice_payloads(moved)
    assert len(payloads) > 1
    assert all(len(payload.encode()) <= NOTICE_LIMIT_BYTES for payload in payloads)
    heard: dict[str, int] = {}
    for payload in payloads:
        heard.update(parse_notice(payload))
    # Each run with its event count after the commit: its last seq, plus one.
    assert heard == {run: seq + 1 for run, seq in moved}


def test_a_run_id_no_payload_holds_and_an_unreadable_payload_mean_any_run() -> None:
    assert notice_payloads([("x" * NOTICE_LIMIT_BYTES, 3), (run_id(1), 0)]) == [
        ANY_RUN,
        json.dumps([[run_id(1), 0]], separators=(",", ":")),
    ]
    assert parse_notice(ANY_RUN) is None
    assert parse_notice("not json") is None
    assert parse_notice('[["a"]]') is None
    assert notice_payloads([]) == []


# -- PostgreSQL's notices --------------------------------------------------------------------------


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_each_committed_append_transaction_is_one_notice_naming_its_runs(store_url) -> None:
    with EventStore.open(store_url) as store:
        listener = store.changes.listener()
        listener.open()
        try:
            _, a = store.append(run_id(1), [started()], EMPTY_VIEW)
            store.append(run_id(1), [RandomObserved(value="x"), RandomObserved(value="y")], a)
            # Group commit: one transaction, one notice for both runs.
            store.append_batch(
                [
                    AppendRequest(run_id=run_id(2), events=[started()], view=EMPTY_VIEW),
                    AppendRequest(run_id=run_id(3), events=[started()], view=EMPTY_VIEW),
                ]
            )
            # Refused by the database (another writer has seq 1): rolled back, so no notice.
            with pytest.raises(SeqConflict):
                store.append(run_id(1), [RandomObserved(value="z")], a)
            heard = list(listener.notices(0.5))
        finally:
            listener.close()
    assert heard == [{run_id(1): 1}, {run_id(1): 3}, {run_id(2): 1, run_id(3): 1}]


@pytest.mark.skipif(not os.environ.get(POSTGRES_ENV), reason=f"{POSTGRES_ENV} is not set")
def test_two_stores_in_one_database_do_not_hear_each_other() -> None:
    base = os.environ[POSTGRES_ENV]
    first_urls, second_urls = _postgres_schema_url(base), _postgres_schema_url(base)
    first_url, second_url = next(first_urls), next(second_urls)
    try:
        with EventStore.open(first_url) as first, EventStore.open(second_url) as second:
            listener = first.changes.listener()
            listener.open()
            try:
                second.append(run_id(1), [started()], EMPTY_VIEW)
                first.append(run_id(2), [started()], EMPTY_VIEW)
                heard = list(listener.notices(0.5))
            finally:
                listener.close()
    finally:
        for urls in (first_urls, second_urls):
            for _ in urls:
                pass
    assert heard == [{run_id(2): 1}]


# -- SQLite's data_version ------------------------------------------------------------------------


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_data_version_changes_only_when_another_connection_commits(store_url) -> None:
    with EventStore.open(store_url) as store, EventStore.open(store_url) as other:
        watch = store.changes.data_version_watch()
        try:
            assert not watch.changed()
            store.read_log(run_id(1))
            assert not watch.changed()
            other.append(run_id(1), [started()], EMPTY_VIEW)
            assert watch.changed()
            assert not watch.changed()
            # This store's own commits are another connection's, too, to the watch's.
            _, view = store.append(run_id(2), [started()], EMPTY_VIEW)
            assert watch.changed()
        finally:
            watch.close()
        store.append(run_id(2), [RandomObserved(value="x")], view)
        unknown = str(uuid.uuid4())
        assert store.changes.event_counts([run_id(1), run_id(2), unknown]) == {
            run_id(1): 1,
            run_id(2): 2,
        }
        many = [str(uuid.uuid4()) for _ in range(1200)] + [run_id(2)]
        assert store.changes.event_counts(many) == {run_id(2): 2}
