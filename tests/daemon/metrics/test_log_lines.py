"""The daemon's log as JSON lines: the formatter on its own, then a real ``salvor serve
--log-format json`` whose every stderr line parses, names the run it concerns, and holds no
secret the daemon was given."""

from __future__ import annotations

import json
import logging
import re
import signal
import sys
from pathlib import Path

import httpx
import trio
from salvor.daemon.metrics import JsonLines, concerning_run

from tests.daemon.serve.test_lifecycle import Daemon
from tests.support.backends import SQLITE_ONLY

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


class JsonDaemon(Daemon):
    def command(self) -> list[str]:
        return [*super().command(), "--log-format", "json", "--auth-token", "SALVOR_TEST_TOKEN"]


async def test_serve_logs_json_lines_with_run_ids_and_no_secret(store_url, tmp_path) -> None:
    daemon = JsonDaemon(store_url, tmp_path)
    try:
        await daemon.start(env={"SALVOR_TEST_TOKEN": TOKEN, "ANTHROPIC_API_KEY": UPSTREAM_KEY})
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=daemon.url, timeout=WAIT, headers=headers) as client:
            agent = (
                await client.post(
                    "/v1/agents", content=REFUND_DESK, headers={"Content-Type": "application/toml"}
                )
            ).json()["agent"]
            run_id = (
                await client.post("/v1/runs", json={"agent": agent, "input": {"invoice_id": "I-1"}})
            ).json()["run"]
            with trio.fail_after(WAIT):
                while (await client.get(f"/v1/runs/{run_id}")).json()["status"]["state"] != (
                    "completed"
                ):
                    await trio.sleep(0.02)
            refused = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}x"})
            assert refused.status_code == 401
        daemon.process.send_signal(signal.SIGTERM)
        assert await daemon.wait_exit() == 0
        output = daemon.output()
    finally:
        await daemon.cleanup()
    lines = [json.loads(text) for text in output.splitlines()]
    assert lines, output
    for line in lines:
        assert {"time", "level", "logger", "message"} <= line.keys() <= KEYS, line
        assert RFC3339_UTC.fullmatch(line["time"]), line
    about_run = [line for line in lines if run_id in line["message"]]
    assert about_run and all(line.get("run") == run_id for line in about_run), about_run
    assert any("rested completed" in line["message"] for line in about_run), about_run
    assert TOKEN not in output and UPSTREAM_KEY not in output
