"""What a store tells other processes of its commits: PostgreSQL's notices (one per append
transaction, naming each run and its last seq, only once committed, on a channel per schema) and
SQLite's data_version watch with the one-query event counts."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    RandomObserved,
    RunStarted,
    decode_envelope,
    encode_envelope,
)
from salvor.store import AppendRequest, EventStore, SeqConflict
from salvor.store._change_signal import (
    ANY_RUN,
    NOTICE_LIMIT_BYTES,
    ChangeNotice,
    notice_item,
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


def bare(run: str, first: int, last: int) -> tuple[str, str]:
    item = notice_item(run, first, last)
    return item, item


def test_payloads_stay_under_the_servers_limit_and_name_every_run() -> None:
    moved = [(run_id(n), n * 1000, n * 1000 + n % 3) for n in range(1000)]
    payloads = notice_payloads("a1b2c3", [bare(*span) for span in moved])
    assert len(payloads) > 1
    assert all(len(payload.encode()) <= NOTICE_LIMIT_BYTES for payload in payloads)
    heard: dict[str, tuple[int, int]] = {}
    for payload in payloads:
        notice = parse_notice(payload)
        assert notice.origin == "a1b2c3" and notice.envelopes == {}
        heard.update(notice.runs)
    assert heard == {run: (first, last) for run, first, last in moved}
    # Each run's event count after the commit: its last seq, plus one.
    assert parse_notice(payloads[0]).counts()[run_id(2)] == 2002 + 1


def test_events_travel_with_a_notice_only_while_they_fit() -> None:
    # Non-ASCII text weighs its UTF-8 bytes.
    small = ['{"seq":0,"v":"é"}']
    large = ['{"v":"' + "é" * 4000 + '"}']
    payloads = notice_payloads(
        "o",
        [
            (notice_item(run_id(1), 0, 0, small), notice_item(run_id(1), 0, 0)),
            (notice_item(run_id(2), 3, 3, large), notice_item(run_id(2), 3, 3)),
        ],
    )
    assert all(len(payload.encode()) <= NOTICE_LIMIT_BYTES for payload in payloads)
    notice = parse_notice(payloads[0])
    assert notice.runs == {run_id(1): (0, 0), run_id(2): (3, 3)}
    assert notice.envelopes == {run_id(1): [{"seq": 0, "v": "é"}]}


def test_a_run_id_no_payload_holds_and_an_unreadable_payload_mean_any_run() -> None:
    assert notice_payloads("o", [bare("x" * NOTICE_LIMIT_BYTES, 3, 3), bare(run_id(1), 0, 0)]) == [
        "o " + ANY_RUN,
        "o " + json.dumps([[run_id(1), 0, 0]], separators=(",", ":")),
    ]
    for payload in ("o " + ANY_RUN, "o not json", 'o [["a"]]', "o"):
        assert parse_notice(payload) == ChangeNotice("o", None)
    assert notice_payloads("o", []) == []


# -- PostgreSQL's notices --------------------------------------------------------------------------


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_each_committed_append_transaction_is_one_notice_naming_its_runs(store_url) -> None:
    with EventStore.open(store_url) as store, EventStore.open(store_url) as other:
        listener = store.changes.listener()
        listener.open()
        try:
            _, a = other.append(run_id(1), [started()], EMPTY_VIEW)
            other.append(run_id(1), [RandomObserved(value="x"), RandomObserved(value="y")], a)
            # Group commit: one transaction, one notice for both runs.
            other.append_batch(
                [
                    AppendRequest(run_id=run_id(2), events=[started()], view=EMPTY_VIEW),
                    AppendRequest(run_id=run_id(3), events=[started()], view=EMPTY_VIEW),
                ]
            )
            # Refused by the database (another writer has seq 1): rolled back, so no notice.
            with pytest.raises(SeqConflict):
                other.append(run_id(1), [RandomObserved(value="z")], a)
            # The listener's own store handle: its process heard of it at commit, so it is not
            # told again.
            store.append(run_id(4), [started()], EMPTY_VIEW)
            heard = list(listener.notices(0.5))
        finally:
            listener.close()
    assert {notice.origin for notice in heard} == {other.changes.origin}
    assert [notice.runs for notice in heard] == [
        {run_id(1): (0, 0)},
        {run_id(1): (1, 2)},
        {run_id(2): (0, 0), run_id(3): (0, 0)},
    ]
    # Small events travel with their notice, as the store's log has them, byte for byte.
    with EventStore.open(store_url) as store:
        for notice in heard:
            for run, carried in notice.envelopes.items():
                first, last = notice.runs[run]
                assert [encode_envelope(decode_envelope(e)) for e in carried] == [
                    encode_envelope(e) for e in store.read_log(run)[first : last + 1]
                ]
    assert sum(len(notice.envelopes) for notice in heard) == 4


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_large_events_are_named_by_their_notice_not_carried(store_url) -> None:
    with EventStore.open(store_url) as store, EventStore.open(store_url) as other:
        listener = store.changes.listener()
        listener.open()
        try:
            _, a = other.append(run_id(1), [started()], EMPTY_VIEW)
            other.append(run_id(1), [RandomObserved(value="x" * 3000)], a)
            heard = list(listener.notices(0.5))
        finally:
            listener.close()
    assert [notice.runs for notice in heard] == [{run_id(1): (0, 0)}, {run_id(1): (1, 1)}]
    assert [list(notice.envelopes) for notice in heard] == [[run_id(1)], []]


@pytest.mark.skipif(not os.environ.get(POSTGRES_ENV), reason=f"{POSTGRES_ENV} is not set")
def test_two_stores_in_one_database_do_not_hear_each_other() -> None:
    base = os.environ[POSTGRES_ENV]
    first_urls, second_urls = _postgres_schema_url(base), _postgres_schema_url(base)
    first_url, second_url = next(first_urls), next(second_urls)
    try:
        with (
            EventStore.open(first_url) as first,
            EventStore.open(first_url) as first_writer,
            EventStore.open(second_url) as second,
        ):
            listener = first.changes.listener()
            listener.open()
            try:
                second.append(run_id(1), [started()], EMPTY_VIEW)
                first_writer.append(run_id(2), [started()], EMPTY_VIEW)
                heard = list(listener.notices(0.5))
            finally:
                listener.close()
    finally:
        for urls in (first_urls, second_urls):
            for _ in urls:
                pass
    assert [notice.runs for notice in heard] == [{run_id(2): (0, 0)}]


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


# -- a run list's watch (SQLite's way; PostgreSQL answers it too) ---------------------------------


def test_listed_finds_new_runs_those_in_flight_and_those_named(store: EventStore) -> None:
    from salvor.protocol import RunCompleted
    from salvor.store._change_signal import ListedRun

    store.append(run_id(1), [started()], EMPTY_VIEW)
    store.append(run_id(2), [started(), RunCompleted(output=1)], EMPTY_VIEW)
    past, future = "2000-01-01T00:00:00.000000Z", "9999-01-01T00:00:00.000000Z"
    # New since a moment: every run first recorded after it, at an end or not.
    assert set(store.changes.listed(past, [])) == {run_id(1), run_id(2)}
    # Otherwise a run in flight is found by its state, and one at rest only by name.
    found = store.changes.listed(future, [])
    assert set(found) == {run_id(1)}
    assert found[run_id(1)] == ListedRun(1, "running", found[run_id(1)].last_recorded_at)
    assert set(store.changes.listed(future, [run_id(2), run_id(3)])) == {run_id(1), run_id(2)}
    assert found[run_id(1)].last_recorded_at == store.read_view(run_id(1)).last_recorded_at
