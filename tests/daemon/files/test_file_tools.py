"""The file and shell tools on a built-in agent, in a real daemon (``serve``, real HTTP, a real
store) with a workspace: the scripted provider drives the calls, the agent is told each answer.

Each tool does its work on the folder; a path that leads out of the workspace (a symbolic link,
``..``) or outside the agent's write globs is refused as the call's error and changes nothing;
``bash`` is refused at registration unless the operator turned it on, and every file tool is
refused on a daemon with no workspace.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from salvor.daemon.tools import Workspace

from tests.support.api_server import agent_toml
from tests.support.flows import tool_results
from tests.support.scripted_provider import tool_loop_script

ALL = ["read", "ls", "find", "grep", "write", "edit", "bash"]


def _agent(base_url: str, tools, access: str = 'access = { write = ["notes/**"] }') -> str:
    return agent_toml(base_url, tools=tools, extra=access)


def _workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "notes").mkdir(parents=True)
    (root / "docs" / "deep").mkdir(parents=True)
    (root / "readme.md").write_text("# Workspace\nthe needle is here\n")
    (root / "docs" / "deep" / "guide.md").write_text("intro\nanother needle\n")
    (root / "notes" / "log.md").write_text("day 1\n")
    return root


async def _answers(server, provider, tools, plan, **agent) -> list[dict]:
    """Run an agent of ``tools`` through ``plan``; the tool results its model was told."""
    agent_id = await server.register_agent(_agent(provider.base_url, tools, **agent))
    run_id = await server.start_run(agent_id, "work in the workspace")
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    return tool_results(provider.calls[-1])


async def test_each_file_tool_works_in_the_workspace(server_factory, providers, tmp_path) -> None:
    root = _workspace(tmp_path)
    server = await server_factory(workspace=Workspace(root=str(root), shell=True))
    plan = [
        ("ls", {}),
        ("read", {"path": "readme.md"}),
        ("find", {"pattern": "*.md"}),
        ("grep", {"pattern": "needle"}),
        ("write", {"path": "notes/new/today.md", "content": "written\n"}),
        ("edit", {"path": "notes/log.md", "old_text": "day 1\n", "new_text": "day 1\nday 2\n"}),
        ("bash", {"command": "echo ran >> notes/count.txt; cat notes/count.txt; pwd"}),
    ]
    provider = providers(tool_loop_script(plan))
    answers = await _answers(server, provider, ALL, plan)
    texts = [answer["content"] for answer in answers]
    assert not any(answer.get("is_error") for answer in answers), texts
    assert texts[0].split("\n") == ["docs/", "notes/", "readme.md"]
    assert texts[1] == "# Workspace\nthe needle is here\n"
    assert texts[2].split("\n") == ["docs/deep/guide.md", "notes/log.md", "readme.md"]
    assert texts[3].split("\n") == [
        "docs/deep/guide.md:2: another needle",
        "readme.md:2: the needle is here",
    ]
    assert json.loads(texts[4]) == {"path": "notes/new/today.md", "bytes": 8}
    assert json.loads(texts[5]) == {"path": "notes/log.md", "bytes": 12, "replacements": 1}
    shell = json.loads(texts[6])
    assert shell["exit_code"] == 0 and shell["output"] == f"ran\n{root}\n", shell
    assert (root / "notes" / "new" / "today.md").read_text() == "written\n"
    assert (root / "notes" / "log.md").read_text() == "day 1\nday 2\n"
    assert (root / "notes" / "count.txt").read_text() == "ran\n"


async def test_a_path_out_of_the_workspace_or_its_write_globs_is_refused(
    server_factory, providers, tmp_path
) -> None:
    root = _workspace(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside\n")
    os.symlink(secret, root / "notes" / "escape.txt")
    os.symlink(tmp_path, root / "up")
    server = await server_factory(workspace=Workspace(root=str(root)))
    plan = [
        ("read", {"path": "notes/escape.txt"}),  # a link out, read
        ("write", {"path": "notes/escape.txt", "content": "clobbered\n"}),  # a link out, written
        ("read", {"path": "../secret.txt"}),  # `..` out
        ("ls", {"path": "up"}),  # a linked folder out
        ("write", {"path": "readme.md", "content": "clobbered\n"}),  # outside `access.write`
        ("edit", {"path": "docs/deep/guide.md", "old_text": "intro", "new_text": "x"}),
        ("grep", {"pattern": "outside", "path": "up"}),
    ]
    provider = providers(tool_loop_script(plan))
    answers = await _answers(server, provider, ["read", "ls", "write", "edit", "grep"], plan)
    assert all(answer.get("is_error") for answer in answers), answers
    for answer in answers[:4] + answers[6:]:
        assert "leads outside the workspace" in answer["content"], answer
    for answer in answers[4:6]:
        assert "not among the paths this agent may write" in answer["content"], answer
    assert secret.read_text() == "outside\n"
    assert (root / "readme.md").read_text().startswith("# Workspace")
    assert (root / "docs" / "deep" / "guide.md").read_text() == "intro\nanother needle\n"


async def test_reads_are_held_to_the_read_globs(server_factory, providers, tmp_path) -> None:
    root = _workspace(tmp_path)
    server = await server_factory(workspace=Workspace(root=str(root)))
    plan = [
        ("read", {"path": "readme.md"}),
        ("ls", {}),
        ("find", {"pattern": "*.md"}),
        ("grep", {"pattern": "needle"}),
    ]
    provider = providers(tool_loop_script(plan))
    answers = await _answers(
        server, provider, ["read", "ls", "find", "grep"], plan,
        access='access = { read = ["docs/**"] }',
    )  # fmt: skip
    assert (
        answers[0]["is_error"]
        and "not among the paths this agent may read" in (answers[0]["content"])
    )
    assert [answer["content"] for answer in answers[1:]] == [
        "docs/",
        "docs/deep/guide.md",
        "docs/deep/guide.md:2: another needle",
    ]


async def test_a_huge_file_is_read_in_part_and_says_so(server_factory, providers, tmp_path) -> None:
    root = _workspace(tmp_path)
    text = "".join(f"line {n}\n" for n in range(1, 5001))
    (root / "big.txt").write_text(text)
    server = await server_factory(workspace=Workspace(root=str(root)))
    plan = [("read", {"path": "big.txt"}), ("read", {"path": "big.txt", "offset": 4999})]
    provider = providers(tool_loop_script(plan))
    first, rest = await _answers(server, provider, ["read"], plan)
    assert first["content"].startswith("line 1\n")
    assert first["content"].endswith(
        f"line 2000\n\n[lines 1-2000 of 5000 ({len(text)} bytes) shown; read on with offset=2001]"
    )
    assert rest["content"] == "line 4999\nline 5000\n"


@pytest.mark.parametrize("tool", ["bash", "read"])
async def test_a_tool_the_operator_did_not_offer_is_a_definition_error(
    server_factory, providers, tmp_path, tool
) -> None:
    """``bash`` on a daemon with a workspace but no --allow-bash; a file tool on one with no
    workspace at all."""
    workspace = Workspace(root=str(_workspace(tmp_path))) if tool == "bash" else None
    server = await server_factory(workspace=workspace)
    provider = providers(tool_loop_script([]))
    response = await server.client.post(
        "/v1/agents",
        content=_agent(provider.base_url, [tool]),
        headers={"Content-Type": "application/toml"},
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert ("--allow-bash" if tool == "bash" else "no workspace") in message, message


async def test_bash_gets_the_allow_listed_environment_and_its_timeout(
    server_factory, providers, tmp_path, monkeypatch
) -> None:
    """No secret of the daemon's reaches a command; the run's orphan marks do; a command past
    its timeout is killed with what it started, and says so."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-the-daemons-own")
    monkeypatch.setenv("SALVOR_STORE", "postgresql://user:pw@db/salvor")
    root = _workspace(tmp_path)
    server = await server_factory(workspace=Workspace(root=str(root), shell=True))
    plan = [
        ("bash", {"command": "env"}),
        ("bash", {"command": "sleep 30 & echo $! > notes/pid.txt; sleep 30", "timeout": 1}),
    ]
    provider = providers(tool_loop_script(plan))
    listed, slow = (
        json.loads(a["content"]) for a in await _answers(server, provider, ["bash"], plan)
    )
    names = {line.split("=", 1)[0] for line in listed["output"].splitlines() if "=" in line}
    assert "ANTHROPIC_API_KEY" not in names and "SALVOR_STORE" not in names, names
    assert {"SALVOR_RUN_ID", "SALVOR_DAEMON", "SALVOR_OWNER"} <= names, names
    assert slow["exit_code"] is None and slow["timed_out"] == "killed after 1s", slow
    left = int((root / "notes" / "pid.txt").read_text())
    with trio.fail_after(10):
        while _alive(left):
            await trio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


async def test_a_markdown_agent_names_file_tools_and_access(
    server_factory, providers, tmp_path
) -> None:
    root = _workspace(tmp_path)
    server = await server_factory(workspace=Workspace(root=str(root)))
    plan = [
        ("write", {"path": "notes/md.txt", "content": "from markdown\n"}),
        ("write", {"path": "docs/md.txt", "content": "not here\n"}),
    ]
    provider = providers(tool_loop_script(plan))
    agent = await server.register_agent(
        "---\nname: scribe\nmodel: scripted-model\ntools: read, write\n"
        'access:\n  write: ["notes/*.txt"]\n'
        f"llm:\n  base_url: {provider.base_url}\n  max_retries: 0\n---\nYou write notes.\n",
        content_type="text/markdown",
    )
    run_id = await server.start_run(agent, "write")
    assert (await server.wait_resting(run_id))["status"]["state"] == "completed"
    wrote, refused = tool_results(provider.calls[-1])
    assert json.loads(wrote["content"]) == {"path": "notes/md.txt", "bytes": 14}
    assert refused["is_error"] and "may write" in refused["content"], refused
    assert (root / "notes" / "md.txt").read_text() == "from markdown\n"
    assert not (root / "docs" / "md.txt").exists()


async def test_grep_patterns_run_in_linear_time(server_factory, providers, tmp_path) -> None:
    """A pattern that backtracks exponentially in Python's ``re`` (2**40 steps on this line) is
    answered at once; ``literal`` and ``ignore_case`` as asked; a pattern RE2 refuses is the
    call's error."""
    root = _workspace(tmp_path)
    (root / "notes" / "many.txt").write_text("a" * 40 + "b\nA.B\naxb\n")
    server = await server_factory(workspace=Workspace(root=str(root)))
    plan = [
        ("grep", {"pattern": "^(a+)+$", "path": "notes"}),
        ("grep", {"pattern": "a.b", "path": "notes", "literal": True, "ignore_case": True}),
        ("grep", {"pattern": "(a", "path": "notes"}),
    ]
    provider = providers(tool_loop_script(plan))
    hard, literal, broken = await _answers(server, provider, ["grep"], plan)
    assert hard["content"] == "(no matching lines)"
    assert literal["content"] == "notes/many.txt:2: A.B"
    assert broken["is_error"] and "missing )" in broken["content"], broken


async def test_an_edit_names_one_place_or_asks_for_every_one(
    server_factory, providers, tmp_path
) -> None:
    """An ``old_text`` not there, or there twice without ``replace_all``, is the call's error
    and writes nothing (no write intent is recorded: the plan refused); ``replace_all`` changes
    each place."""
    root = _workspace(tmp_path)
    (root / "notes" / "twice.md").write_text("x\nx\n")
    server = await server_factory(workspace=Workspace(root=str(root)))
    plan = [
        ("edit", {"path": "notes/twice.md", "old_text": "y", "new_text": "z"}),
        ("edit", {"path": "notes/twice.md", "old_text": "x", "new_text": "z"}),
        ("edit", {"path": "notes/twice.md", "old_text": "x", "new_text": "z", "replace_all": True}),
    ]
    provider = providers(tool_loop_script(plan))
    agent_id = await server.register_agent(_agent(provider.base_url, ["edit"]))
    run_id = await server.start_run(agent_id, "edit")
    assert (await server.wait_resting(run_id))["status"]["state"] == "completed"
    missing, ambiguous, every = tool_results(provider.calls[-1])
    assert missing["is_error"] and "is not in the file" in missing["content"]
    assert ambiguous["is_error"] and "2 times" in ambiguous["content"]
    assert json.loads(every["content"]) == {"path": "notes/twice.md", "bytes": 4, "replacements": 2}
    assert (root / "notes" / "twice.md").read_text() == "z\nz\n"
    log = await server.state.runtime.reads.log(run_id)
    asked = [e.event.tool for e in log if e.kind == "ToolCallRequested"]
    assert asked == ["plan_file_change"] * 3 + ["edit"]
