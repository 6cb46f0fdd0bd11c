"""The daemon's log as JSON lines: the formatter on its own, then a daemon's own records (``serve``
in process) through it: every line parses, names the run it concerns, and holds no secret the
daemon was given; and the ``--log-format`` flag that puts them on stderr. A real ``salvor serve
--log-format json`` killed and restarted is tests/chaos/test_kill_process_agent.py's."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from salvor.daemon.cli import _serve_command
from salvor.daemon.cli._parser import command_parser
from salvor.daemon.metrics import JsonLines, concerning_run

from tests.support.backends import SQLITE_ONLY
from tests.support.cli import salvor_in_process

# What is tested is the log's shape, which no backend changes.
STORE_BACKENDS = SQLITE_ONLY

REPO = Path(__file__).resolve().parents[3]
REFUND_DESK = (REPO / "contrib" / "agents" / "refund-desk.toml").read_text()
TOKEN = "log-test-token-do-not-print"
UPSTREAM_KEY = "sk-ant-log-test-key-do-not-print"
RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
KEYS = {"time", "level", "logger", "message", "run", "error", "stack"}
WAIT = 30


def record(message: str, *args: object, **kwargs: object) -> logging.LogRecord:
    logger = logging.getLogger("salvor.test")
    exc_info = kwargs.pop("exc_info", None)
    return logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, message, args, exc_info, extra=kwargs or None
    )


def line_of(rec: logging.LogRecord) -> dict:
    text = JsonLines().format(rec)
    assert "\n" not in text
    return json.loads(text)


def test_a_record_is_one_object_on_one_line() -> None:
    line = line_of(record("two\nlines for %s", "INV-1"))
    assert set(line) == {"time", "level", "logger", "message"}
    assert RFC3339_UTC.fullmatch(line["time"]), line
    assert (line["level"], line["logger"]) == ("WARNING", "salvor.test")
    assert line["message"] == "two\nlines for INV-1"


def test_the_run_is_the_call_sites_else_the_drives() -> None:
    assert line_of(record("x", run="run-a"))["run"] == "run-a"
    # An extra that is not the run never reaches the line (it could hold anything).
    assert "headers" not in line_of(record("x", headers={"Authorization": "Bearer t"}))

    async def drive() -> dict:
        concerning_run("run-b")
        return line_of(record("inside the drive")) | {"explicit": line_of(record("x", run="c"))}

    inside = trio.run(drive)
    assert inside["run"] == "run-b" and inside["explicit"]["run"] == "c"
    # The mark was the drive task's own.
    assert "run" not in line_of(record("outside"))


def test_an_exception_is_the_error_field() -> None:
    try:
        raise ValueError("the store said no")
    except ValueError:
        line = line_of(record("failed", exc_info=sys.exc_info()))
    assert (
        line["error"].startswith("Traceback") and "ValueError: the store said no" in line["error"]
    )


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """What the daemon's loggers write, as ``--log-format json`` writes it, while the test runs."""
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(JsonLines())
    salvor = logging.getLogger("salvor")
    level = salvor.level
    salvor.addHandler(handler)
    salvor.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        salvor.removeHandler(handler)
        salvor.setLevel(level)


async def test_a_daemons_lines_name_the_run_and_hold_no_secret(
    server_factory, json_log, monkeypatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", UPSTREAM_KEY)
    server = await server_factory(auth_token=TOKEN)
    agent = await server.register_agent(REFUND_DESK)
    run_id = await server.start_run(agent, {"invoice_id": "I-1"})
    assert (await server.wait_resting(run_id))["status"]["state"] == "completed"
    refused = await server.new_client(headers={"Authorization": f"Bearer {TOKEN}x"}).get("/metrics")
    assert refused.status_code == 401
    await server.stop()
    output = json_log.getvalue()
    lines = [json.loads(text) for text in output.splitlines()]
    assert lines, output
    for line in lines:
        assert {"time", "level", "logger", "message"} <= line.keys() <= KEYS, line
        assert RFC3339_UTC.fullmatch(line["time"]), line
    about_run = [line for line in lines if run_id in line["message"]]
    # The drive says how the run rested: a line of the drive's task, marked with its run.
    assert any("rested completed" in line["message"] for line in about_run), lines
    assert all(line.get("run") == run_id for line in about_run), about_run
    assert TOKEN not in output and UPSTREAM_KEY not in output


def test_serve_takes_text_or_json_and_json_puts_json_lines_on_stderr(monkeypatch) -> None:
    parse = command_parser().parse_args
    assert parse(["serve"]).log_format == "text"
    assert parse(["serve", "--log-format", "json"]).log_format == "json"
    refused = salvor_in_process("serve", "--log-format", "xml")
    assert refused.returncode == 2 and "invalid choice: 'xml'" in refused.stderr
    # What `salvor serve` sets up before it serves, on a process with no logging set up yet.
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(logging.root, "level", logging.WARNING)
    monkeypatch.setattr(logging.getLogger("httpx"), "level", logging.NOTSET)
    _serve_command.log_to_stderr("json")
    (handler,) = logging.root.handlers
    assert isinstance(handler.formatter, JsonLines) and handler.stream is sys.stderr
    assert logging.root.level == logging.INFO
    # Not a line per request the daemon sends (httpx's INFO), but its warnings.
    httpx_log = logging.getLogger("httpx")
    assert not httpx_log.isEnabledFor(logging.INFO) and httpx_log.isEnabledFor(logging.WARNING)
