"""The pieces of ``salvor serve --workers N`` that need no process: the flag's values, what a
worker is told through its environment, its command line, how a worker's end is described, and
the ``worker`` label on every series of a worker's ``/metrics`` and field of its log lines."""

from __future__ import annotations

import json
import logging
import os
import signal

import pytest
from salvor.daemon.cli._arguments import MAX_WORKERS, cores, worker_count
from salvor.daemon.cli._errors import UsageError
from salvor.daemon.cli._serve_command import worker_processes
from salvor.daemon.cli._serve_flags import DEFAULT_WORKERS
from salvor.daemon.metrics import DaemonMetrics, JsonLines, Readings
from salvor.daemon.serve import WorkerRole
from salvor.daemon.serve._workers import describe_exit, worker_command


def test_workers_flag_takes_a_count_or_auto():
    assert worker_count("1") == 1
    assert worker_count("4") == 4
    assert worker_count("auto") == "auto" == DEFAULT_WORKERS
    for refused in ("0", "-1", "two", "", str(MAX_WORKERS + 1), "1.5"):
        with pytest.raises(Exception, match="--workers"):
            worker_count(refused)


def test_auto_is_one_worker_per_core_this_process_may_use(tmp_path):
    for store in (f"sqlite:///{tmp_path}/salvor.db", "postgresql+psycopg://db/salvor"):
        assert worker_processes("auto", store) == min(cores(), MAX_WORKERS)
        assert worker_processes(3, store) == 3
    assert cores() == len(os.sched_getaffinity(0))


IN_MEMORY = (
    "sqlite://",
    "sqlite:///:memory:",
    "sqlite:///file::memory:?cache=shared",
    "sqlite:///file:runs?mode=memory&uri=true",
)


@pytest.mark.parametrize("store", IN_MEMORY)
def test_auto_over_a_store_only_one_process_sees_is_one_process_and_says_why(store, caplog):
    with caplog.at_level(logging.INFO, logger="salvor.workers"):
        assert worker_processes("auto", store) == 1
    [line] = [r.getMessage() for r in caplog.records if r.name == "salvor.workers"]
    assert "one process serves, because" in line and "in-memory SQLite" in line
    assert worker_processes(1, store) == 1


@pytest.mark.parametrize("store", IN_MEMORY)
def test_several_workers_asked_over_a_store_only_one_process_sees_are_refused(store):
    with pytest.raises(UsageError, match=r"^--workers 3 needs a store every worker process") as e:
        worker_processes(3, store)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "role",
    [
        WorkerRole(index=0, listen_fd=3, lifeline_fd=5),
        WorkerRole(index=1, listen_fd=3, lifeline_fd=7),
    ],
)
def test_a_worker_reads_back_the_role_its_supervisor_gave(role):
    environment = role.environment()
    assert environment["SALVOR_WORKER_INDEX"] == str(role.index)
    assert WorkerRole.from_environment({**os.environ, **environment}) == role


def test_without_the_supervisor_variables_serve_is_a_daemon_of_its_own():
    assert WorkerRole.from_environment({"SALVOR_WORKER_INDEX": "1"}) is None
    with pytest.raises(ValueError, match="unset them"):
        WorkerRole.from_environment({"SALVOR_WORKER_INDEX": "x", "SALVOR_WORKER_FDS": "3,4"})
    with pytest.raises(ValueError, match="unset them"):
        WorkerRole.from_environment({"SALVOR_WORKER_INDEX": "1", "SALVOR_WORKER_FDS": "3"})


def test_a_worker_command_is_the_supervisors_with_one_worker_and_its_own_proxy_port():
    argv = ["serve", "--workers", "3", "--auth-token", "TOKEN_VAR"]
    assert worker_command(argv, 2, 0)[-7:] == [*argv, "--workers", "1"]
    assert worker_command(argv, 2, 9000)[-2:] == ["--proxy-port", "9002"]


def test_a_workers_end_is_named():
    assert describe_exit(1) == "exited with status 1"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"


def test_a_workers_metrics_carry_its_index_on_every_series():
    labelled = DaemonMetrics(worker=1).exposition(Readings()).decode()
    samples = [line for line in labelled.splitlines() if line and not line.startswith("#")]
    assert samples
    assert all('worker="1"' in line for line in samples)
    plain = DaemonMetrics().exposition(Readings()).decode()
    assert "worker=" not in plain


def test_a_workers_log_lines_name_it():
    record = logging.LogRecord("salvor.serve", logging.INFO, __file__, 1, "serving", None, None)
    assert json.loads(JsonLines(worker=1).format(record))["worker"] == 1
    assert "worker" not in json.loads(JsonLines().format(record))
