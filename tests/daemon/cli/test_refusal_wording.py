"""A refusal on the command line tells its user the next step as a ``salvor`` command, never as an
HTTP route: the same refusals ``tests/daemon/api/test_refusal_wording.py`` reads over HTTP.

The runs' logs are recorded by hand into the store the command opens (what a crashed daemon or a
killed ``salvor run`` leaves); each command is ``main(argv)`` in this process, and each refusal is
one sentence on stderr with exit 1, the store as it was.
"""

from __future__ import annotations

import json
import uuid

from salvor.protocol import (
    EMPTY_VIEW,
    ModelCallRequested,
    RunStarted,
    SleepStarted,
    ToolCallRequested,
    graph_from_value,
)
from salvor.store import EventStore

from tests.protocol.graphs import publishing
from tests.support.api import FAR_WAKE
from tests.support.backends import SQLITE_ONLY
from tests.support.cli import salvor_in_process
from tests.support.graph_runs import PUBLISH_WRITE, published

# What is tested is the command line's sentences: SQLite alone (tests/support/backends.py).
STORE_BACKENDS = SQLITE_ONLY
UNREGISTERED = "sha256:" + "0" * 64


def _seed(store_url: str, *events) -> str:
    run_id = str(uuid.uuid4())
    head = RunStarted(agent_def_hash=UNREGISTERED, input=None)
    with EventStore.open(store_url) as store:
        store.append(run_id, [head, *events], EMPTY_VIEW)
    return run_id


def _event_total(store_url: str) -> int:
    with EventStore.open(store_url) as store:
        runs, _ = store.list_runs()
        return sum(run.event_count for run in runs)


def refused(store_url: str, *args: str, step: str) -> str:
    """``salvor ARGS``'s one sentence, once it names ``step`` and no HTTP route."""
    result = salvor_in_process(*args, "--store", store_url)
    assert result.returncode == 1, result
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result
    assert step in result.stderr, result.stderr
    assert "/v1/" not in result.stderr and "POST " not in result.stderr, result.stderr
    return result.stderr


def test_a_dangling_write_names_salvor_resolve(store_url) -> None:
    write = ToolCallRequested(tool="publish_post", input={}, effect="write", idempotency_key=None)
    run_id = _seed(store_url, write)
    before = _event_total(store_url)
    refused(store_url, "resume", run_id, step=f"`salvor resolve {run_id} --output JSON`")
    assert _event_total(store_url) == before


def test_a_sleeping_run_names_salvor_wake_and_its_instant(store_url) -> None:
    run_id = _seed(store_url, SleepStarted(wake_at=FAR_WAKE))
    sentence = refused(store_url, "resume", run_id, step="`salvor wake`")
    assert FAR_WAKE in sentence and "wake sweeper" in sentence
    # A script reads the same words in the envelope.
    result = salvor_in_process("resume", run_id, "--store", store_url, "--json")
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "still_sleeping" and "`salvor wake`" in error["message"]


def test_an_unknown_agent_names_the_command_that_stores_one(store_url) -> None:
    refused(store_url, "run", UNREGISTERED, step="`salvor run AGENT_FILE`")


def test_a_resolve_with_no_dangling_write_names_salvor_resume(store_url) -> None:
    run_id = _seed(store_url, ModelCallRequested(request_hash="sha256:" + "1" * 64))
    refused(store_url, "resolve", run_id, "--output", "1", step=f"`salvor resume {run_id}`")


def test_a_fork_of_a_parked_origin_names_salvor_resolve(store_url) -> None:
    graph = graph_from_value(publishing())
    origin = str(uuid.uuid4())
    with EventStore.open(store_url) as store:
        store.append(origin, published(graph.hash)[: PUBLISH_WRITE + 1], EMPTY_VIEW)
        store.definitions.put_graph(graph.hash, document=graph.document, summary=graph.summary())
    before = _event_total(store_url)
    sentence = refused(
        store_url,
        "fork",
        origin,
        "--from-node",
        "publish",
        step=f"`salvor resolve {origin} --output JSON`",
    )
    assert sentence.rstrip().endswith("then fork")
    assert _event_total(store_url) == before
