"""The deliverer against real receivers: a loopback HTTP server counting POSTs, and a command.

Rows come from real appends through the store access (a store opened with notifications on).
Time is the test's: the deliverer reads a clock the test moves, so a retry's backoff is checked
to the microsecond and nothing waits for it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
from salvor.daemon.notify import (
    SIGNATURE_HEADER,
    Deliverer,
    NotifyConfig,
    retry_delay,
    signature,
)
from salvor.daemon.recording import open_store_access
from salvor.protocol import (
    EMPTY_VIEW,
    RunStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    format_instant,
)

from tests.support.backends import SQLITE_ONLY
from tests.support.runtime import Clock
from tests.support.webhook_receiver import WebhookReceiver

# The outbox's reads and marks are the store's, tested on both backends in tests/store.
STORE_BACKENDS = SQLITE_ONLY

SECRET = b"notify-secret-for-tests"
GATE = Suspended(reason="approve?", input_schema={"type": "object"})


def later_clock() -> Clock:
    clock = Clock()
    clock.now = datetime.now(UTC) + timedelta(seconds=1)  # every row written so far is due
    return clock


@pytest.fixture
async def access(store_url: str):
    async with open_store_access(store_url, notifications=True) as opened:
        yield opened


async def gate(access, run_id: str = "run-1") -> None:
    _, view = await access.append(
        run_id, [RunStarted(agent_def_hash="sha256:a", input=1)], EMPTY_VIEW
    )
    await access.append(run_id, [GATE], view)


async def rows(access):
    return await access.read(access.store.outbox.entries)


def test_the_backoff_doubles_from_one_second_to_five_minutes() -> None:
    assert [retry_delay(n) for n in range(1, 11)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert retry_delay(10_000) == 300
    assert retry_delay(3, base=0.5) == 2.0


async def test_a_webhook_gets_the_body_signed_and_the_row_is_delivered(access) -> None:
    await gate(access)
    with WebhookReceiver([200]) as receiver:
        deliverer = Deliverer(
            access,
            NotifyConfig(webhook=receiver.url, secret=SECRET),
            clock=later_clock(),
        )
        try:
            assert await deliverer.deliver_due() == 1
            assert await deliverer.deliver_due() == 0  # delivered rows are never due again
        finally:
            await deliverer.aclose()
    (request,) = receiver.requests
    (row,) = await rows(access)
    assert row.delivered_at is not None and row.attempts == 0
    assert request.body == row.body.encode()
    assert request.headers["content-type"] == "application/json"
    expected = hmac.new(SECRET, request.body, hashlib.sha256).hexdigest()
    assert request.headers[SIGNATURE_HEADER.lower()] == f"sha256={expected}"
    assert signature(SECRET, request.body) == f"sha256={expected}"
    body = request.json()
    assert (body["kind"], body["run"], body["seq"]) == ("gate", "run-1", 1)
    assert body["status"] == {
        "state": "suspended",
        "reason": "approve?",
        "input_schema": {"type": "object"},
    }


async def test_without_a_secret_nothing_is_signed(access) -> None:
    await gate(access)
    with WebhookReceiver([200]) as receiver:
        deliverer = Deliverer(access, NotifyConfig(webhook=receiver.url), clock=later_clock())
        try:
            await deliverer.deliver_due()
        finally:
            await deliverer.aclose()
    (request,) = receiver.requests
    assert SIGNATURE_HEADER.lower() not in request.headers


async def test_two_failures_back_off_and_the_third_attempt_delivers(access, caplog) -> None:
    await gate(access)
    clock = later_clock()
    with WebhookReceiver([500, 500, 200]) as receiver:
        deliverer = Deliverer(
            access, NotifyConfig(webhook=receiver.url, secret=SECRET), clock=clock
        )
        try:
            with caplog.at_level(logging.WARNING, logger="salvor.notify"):
                assert await deliverer.deliver_due() == 0
                (row,) = await rows(access)
                assert row.attempts == 1
                assert row.next_attempt_at == format_instant(clock.now + timedelta(seconds=1))
                # Not due before its backoff has passed: nothing is sent.
                clock.advance(0.999)
                assert await deliverer.deliver_due() == 0
                assert len(receiver.requests) == 1
                clock.advance(0.001)
                assert await deliverer.deliver_due() == 0
                (row,) = await rows(access)
                assert row.attempts == 2
                assert row.next_attempt_at == format_instant(clock.now + timedelta(seconds=2))
                clock.advance(2)
                assert await deliverer.deliver_due() == 1
        finally:
            await deliverer.aclose()
    assert receiver.answered == [500, 500, 200]
    (row,) = await rows(access)
    assert row.delivered_at is not None and row.attempts == 2
    assert len({r.body for r in receiver.requests}) == 1  # the same bytes each time
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2 and all("HTTP 500" in m for m in messages)
    assert not any(SECRET.decode() in m for m in messages)


async def test_a_redirect_is_not_followed_and_counts_as_a_failure(access) -> None:
    await gate(access)
    with WebhookReceiver([302]) as receiver:
        deliverer = Deliverer(access, NotifyConfig(webhook=receiver.url), clock=later_clock())
        try:
            assert await deliverer.deliver_due() == 0
        finally:
            await deliverer.aclose()
    assert [r.path for r in receiver.requests] == ["/hook"]  # the Location was never asked
    (row,) = await rows(access)
    assert row.attempts == 1 and row.delivered_at is None


async def test_an_unreachable_webhook_is_a_failed_attempt(access) -> None:
    await gate(access)
    receiver = WebhookReceiver()
    url = receiver.url
    receiver.close()  # nothing listens there any more
    deliverer = Deliverer(access, NotifyConfig(webhook=url), clock=later_clock())
    try:
        assert await deliverer.deliver_due() == 0
    finally:
        await deliverer.aclose()
    (row,) = await rows(access)
    assert row.attempts == 1


SCRIPT = """\
import sys
body = sys.stdin.buffer.read()
with open(sys.argv[1], "ab") as out:
    out.write(body + b"\\n")
sys.exit(int(sys.argv[2]))
"""


def command(tmp_path: Path, status: int) -> tuple[tuple[str, ...], Path]:
    script = tmp_path / "notify.py"
    script.write_text(SCRIPT)
    out = tmp_path / "received.jsonl"
    return (sys.executable, str(script), str(out), str(status)), out


async def test_a_command_gets_the_body_on_its_stdin(access, tmp_path: Path) -> None:
    await gate(access)
    argv, out = command(tmp_path, 0)
    deliverer = Deliverer(access, NotifyConfig(command=argv), clock=later_clock())
    assert await deliverer.deliver_due() == 1
    (row,) = await rows(access)
    assert out.read_bytes() == row.body.encode() + b"\n"
    assert row.delivered_at is not None


async def test_a_command_that_fails_is_retried(access, tmp_path: Path) -> None:
    await gate(access)
    argv, out = command(tmp_path, 3)
    deliverer = Deliverer(access, NotifyConfig(command=argv), clock=later_clock())
    assert await deliverer.deliver_due() == 0
    (row,) = await rows(access)
    assert row.attempts == 1 and row.delivered_at is None
    assert json.loads(out.read_text())["kind"] == "gate"  # it ran; its exit status refused


async def test_a_command_past_its_timeout_is_killed_and_retried(access, tmp_path: Path) -> None:
    await gate(access)
    config = NotifyConfig(
        command=(sys.executable, "-c", "import time; time.sleep(60)"), timeout=0.2
    )
    deliverer = Deliverer(access, config, clock=later_clock())
    with trio.fail_after(20):
        assert await deliverer.deliver_due() == 0
    (row,) = await rows(access)
    assert row.attempts == 1


async def test_a_command_gets_the_allow_listed_environment(
    access, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("SALVOR_NOTIFY_TEST_SECRET", "do-not-pass")
    await gate(access)
    out = tmp_path / "env.json"
    code = f"import json, os; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"
    deliverer = Deliverer(
        access, NotifyConfig(command=(sys.executable, "-c", code)), clock=later_clock()
    )
    assert await deliverer.deliver_due() == 1
    env = json.loads(out.read_text())
    assert "SALVOR_NOTIFY_TEST_SECRET" not in env and "PATH" in env


def write(seq_input: int = 1) -> ToolCallRequested:
    return ToolCallRequested(
        tool="refund", input={"n": seq_input}, effect="write", idempotency_key=None
    )


async def test_an_unknown_write_waits_for_its_driver_and_is_withdrawn_if_it_completes(
    access,
) -> None:
    started = [RunStarted(agent_def_hash="sha256:a", input=1)]
    await access.append("parked", [*started, write()], EMPTY_VIEW)
    _, done = await access.append("done", [*started, write()], EMPTY_VIEW)
    await access.append("done", [ToolCallCompleted(seq=1, output={"ok": True})], done)
    await access.append("busy", [*started, write()], EMPTY_VIEW)
    clock = later_clock()
    driving = {"busy"}

    async def in_flight(run_id: str) -> bool:
        return run_id in driving

    with WebhookReceiver([200]) as receiver:
        deliverer = Deliverer(
            access,
            NotifyConfig(webhook=receiver.url),
            clock=clock,
            in_flight=in_flight,
            recheck_seconds=1.0,
        )
        try:
            assert await deliverer.deliver_due() == 1
            assert [r.json()["run"] for r in receiver.requests] == ["parked"]
            left = {row.run_id: row for row in await rows(access)}
            assert set(left) == {"parked", "busy"}  # done's write completed: withdrawn unsent
            assert left["busy"].attempts == 0  # postponed, not failed
            assert left["busy"].next_attempt_at == format_instant(clock.now + timedelta(seconds=1))
            clock.advance(1)
            driving.clear()  # its driver parked it
            assert await deliverer.deliver_due() == 1
        finally:
            await deliverer.aclose()
    assert [r.json()["run"] for r in receiver.requests] == ["parked", "busy"]
    assert all(r.json()["kind"] == "unknown_write" for r in receiver.requests)


async def test_serving_delivers_a_row_as_soon_as_it_is_written(access) -> None:
    with WebhookReceiver([200]) as receiver:
        deliverer = Deliverer(access, NotifyConfig(webhook=receiver.url))
        access.on_notification.append(deliverer.poke)
        async with trio.open_nursery() as nursery:
            await nursery.start(deliverer.serve)
            # The outbox is empty: the deliverer now waits a minute or for a poke.
            await trio.testing.wait_all_tasks_blocked()
            await gate(access)
            assert await trio.to_thread.run_sync(receiver.wait_for, 1, 20.0)
            nursery.cancel_scope.cancel()
    assert receiver.requests[0].json()["kind"] == "gate"


def test_the_config_never_shows_its_secret() -> None:
    config = NotifyConfig.from_flags("https://hooks.example/x", None, "S", {"S": "hunter2"})
    assert config.secret == b"hunter2"
    assert "hunter2" not in repr(config) and "signed" in repr(config)


@pytest.mark.parametrize(
    ("webhook", "command", "secret_env", "fragment"),
    [
        ("ftp://hooks.example/x", None, None, "must be an http:// or https:// URL"),
        ("hooks.example/x", None, None, "must be an http:// or https:// URL"),
        ("http:///x", None, None, "names no host"),
        ("http://h:port/x", None, None, "is not a URL"),
        (None, "notify 'unclosed", None, "does not parse"),
        (None, "   ", None, "names no command"),
        ("https://h/x", None, "UNSET_VAR", "UNSET_VAR, but that environment variable is not set"),
        (None, "notify", "S", "no --notify-webhook"),
        (None, None, "S", "--notify-webhook URL"),
    ],
)
def test_flags_the_daemon_cannot_start_with(webhook, command, secret_env, fragment) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        NotifyConfig.from_flags(webhook, command, secret_env, {"S": "x"})


def test_no_flag_is_no_config_and_a_command_is_split_as_a_shell_would() -> None:
    assert NotifyConfig.from_flags(None, None, None, {}) is None
    config = NotifyConfig.from_flags(None, "page-me --team 'on call'", None, {})
    assert config.command == ("page-me", "--team", "on call") and config.webhook is None


async def test_a_webhook_that_never_answers_is_a_failed_attempt_within_its_timeout(access) -> None:
    await gate(access)
    with WebhookReceiver([200]) as receiver:
        receiver.hold()
        deliverer = Deliverer(
            access, NotifyConfig(webhook=receiver.url, timeout=0.2), clock=later_clock()
        )
        try:
            with trio.fail_after(20):
                assert await deliverer.deliver_due() == 0
        finally:
            await deliverer.aclose()
    (row,) = await rows(access)
    assert row.attempts == 1 and row.delivered_at is None


async def test_a_bug_in_a_delivery_backs_its_row_off_and_the_deliverer_goes_on(
    access, caplog
) -> None:
    await gate(access, "run-1")
    await gate(access, "run-2")

    class Broken:
        calls = 0

        async def deliver(self, body: bytes) -> str | None:
            Broken.calls += 1
            if Broken.calls == 1:
                raise RuntimeError("a bug")
            return None

    deliverer = Deliverer(access, NotifyConfig(command=("unused",)), clock=later_clock())
    deliverer._targets = [Broken()]
    with caplog.at_level(logging.ERROR, logger="salvor.notify"):
        assert await deliverer.deliver_due() == 1
    by_run = {row.run_id: row for row in await rows(access)}
    assert sorted((r.attempts, r.delivered_at is None) for r in by_run.values()) == [
        (0, False),
        (1, True),
    ]
    assert "a bug in salvor" in caplog.text
