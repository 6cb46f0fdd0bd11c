"""What the ``salvor`` lane records of a process agent's file write, and how it is probed, on the
pieces themselves (a real workspace folder; ``tests/chaos/test_kill_process_file_tools`` drives
them through a real daemon and a SIGKILL).

A write or edit's intent carries salvor's plan and is keyed by it; an ``expect`` the agent sends
itself is never what is recorded; a plan that refuses is the call's answer; an intent recorded
without a plan (as a daemon before this one recorded it) has no probe.
"""

from __future__ import annotations

from pathlib import Path

from salvor.daemon.files import FileAccess, content_key, file_tools
from salvor.daemon.proxies import probes_lane_write, salvor_server
from salvor.daemon.proxies._salvor_writes import lane_write_probe, plan_lane_write
from salvor.daemon.tools import ProbeVerdict, ToolCall, Workspace

WRITE = {"path": "notes/a.md", "content": "hello\n"}
CALL = "mcp:salvor/tools/call"


def _server(tmp_path: Path):
    root = tmp_path / "ws"
    (root / "notes").mkdir(parents=True)
    access = FileAccess.parse({"write": ["notes/**"]})
    files = file_tools(Workspace(root=str(root)), access, ["read", "write", "edit"])
    return salvor_server("run-1", {}, (), None, files), root


async def test_a_write_records_salvors_plan_never_the_agents_and_is_keyed_by_it(
    tmp_path: Path,
) -> None:
    server, _ = _server(tmp_path)
    forged = {"before": None, "after": "sha256:" + "0" * 64, "path": "notes/a.md", "bytes": 1}
    asked = {"name": "write", "arguments": WRITE, "expect": forged}
    recorded, key, refused = await plan_lane_write(server, "tools/call", asked, "run-1", 4)
    assert refused is None
    plan = recorded["expect"]
    assert plan != forged and plan["path"] == "notes/a.md" and plan["before"] is None
    assert plan["bytes"] == len(b"hello\n")
    assert key == content_key(plan)
    assert {k: v for k, v in recorded.items() if k != "expect"} == {
        "name": "write",
        "arguments": WRITE,
    }
    assert probes_lane_write([], CALL, recorded)
    # Not a file write: recorded as asked, the agent's stray field dropped, nothing planned.
    read = {"name": "read", "arguments": {"path": "notes/a.md"}, "expect": forged}
    assert await plan_lane_write(server, "tools/call", read, "run-1", 5) == (
        {"name": "read", "arguments": {"path": "notes/a.md"}},
        None,
        None,
    )
    # Another lane, or another method: as asked.
    assert await plan_lane_write(None, "tools/call", asked, "run-1", 6) == (asked, None, None)
    assert await plan_lane_write(server, "tools/list", {}, "run-1", 7) == ({}, None, None)


async def test_a_write_whose_plan_refuses_is_answered_with_nothing_planned(tmp_path: Path) -> None:
    server, _ = _server(tmp_path)
    outside = {"name": "write", "arguments": {"path": "readme.md", "content": "x"}}
    recorded, key, refused = await plan_lane_write(server, "tools/call", outside, "run-1", 4)
    assert recorded == outside and key is None
    assert refused["result"]["isError"] is True
    assert "not among the paths this agent may write" in refused["result"]["content"][0]["text"]
    missing = {
        "name": "edit",
        "arguments": {"path": "notes/none.md", "old_text": "a", "new_text": "b"},
    }
    _, _, refused = await plan_lane_write(server, "tools/call", missing, "run-1", 5)
    assert "no file" in refused["result"]["content"][0]["text"]
    # Arguments its schema refuses: nothing planned, the server's own refusal answers them.
    bad = {"name": "write", "arguments": {"path": "notes/a.md"}}
    assert await plan_lane_write(server, "tools/call", bad, "run-1", 6) == (bad, None, None)


async def test_the_probe_of_a_planned_write_answers_as_the_write_does(tmp_path: Path) -> None:
    server, root = _server(tmp_path)
    asked = {"name": "write", "arguments": WRITE}
    recorded, _, _ = await plan_lane_write(server, "tools/call", asked, "run-1", 4)
    probe, reader, write_input = lane_write_probe(server, recorded)
    call = ToolCall(run_id="run-1", seq=4, idempotency_key=None, attempt=1)
    assert await reader.handler(probe.probe_input(write_input), call) == {"landed": False}
    (root / "notes" / "a.md").write_text("hello\n")
    landed = await reader.handler(probe.probe_input(write_input), call)
    verdict, output = probe.verdict(landed)
    assert verdict is ProbeVerdict.LANDED
    assert output["structuredContent"] == {"path": "notes/a.md", "bytes": 6}
    assert output["content"] == [{"type": "text", "text": '{"bytes": 6, "path": "notes/a.md"}'}]
    (root / "notes" / "a.md").write_text("someone else\n")
    changed = await reader.handler(probe.probe_input(write_input), call)
    assert probe.verdict(changed)[0] is ProbeVerdict.UNKNOWN
    # An intent recorded without a plan (an older daemon's) has none.
    assert lane_write_probe(server, asked) is None
    assert not probes_lane_write([], CALL, asked)
