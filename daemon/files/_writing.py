"""``write`` and ``edit``: a file made to hold the bytes the agent intends, once.

A write or an edit is two recorded calls. First a read, ``plan_file_change``, works out what the
file holds now and what it is to hold (``before`` and ``after``: digests of the bytes, None
before for no file); its answer is recorded, so a replay and a recovery see the plan the live
drive made, however the file changed since. Then the write itself, its input the agent's with
that plan as ``expect``, its idempotency key the path and the intended bytes (``content_key``).

The write performs only from ``before``: a file that already holds ``after`` is left alone (the
call lands once), one that holds neither is refused (someone else changed it). Its probe,
``file_holds``, reads the file: ``after`` landed; ``before`` did not (recovery performs it);
anything else cannot tell, and the run waits for a person. An edit that appends is safe so: the
plan pinned the bytes it appends to, and those are gone once it landed.
"""

from __future__ import annotations

from typing import Any

from salvor.protocol import sha256_hash

from ..processes import kill_if_requested
from ._confine import Confinement, digest, refused

PLAN_TOOL = "plan_file_change"
PROBE_TOOL = "file_holds"
# Where a write's input carries its plan (``WRITE_PROBE`` reads it there).
PLAN_FIELD = "expect"
# The largest file an edit loads (it rewrites the whole file).
EDIT_FILE_BYTES = 8 * 1024 * 1024


def plan_input(tool: str, args: Any) -> dict:
    """What the plan of the ``write`` or ``edit`` call ``args`` is asked (recorded as its input):
    the call without a write's content, which only its digest and size stand for."""
    args = args if isinstance(args, dict) else {}
    if tool == "edit":
        fields = ("path", "old_text", "new_text", "replace_all")
        return {"tool": tool, **{name: args[name] for name in fields if name in args}}
    content = args.get("content")
    data = content.encode("utf-8") if isinstance(content, str) else None
    return {
        "tool": tool,
        "path": args.get("path"),
        "content": None if data is None else {"sha256": digest(data), "bytes": len(data)},
    }


def content_key(expect: dict) -> str:
    """The write's idempotency key: its path and the bytes it is to leave there."""
    return sha256_hash({"path": expect["path"], "content": expect["after"]})


def written(expect: dict) -> dict:
    """What a landed write answers (the same whether it performed or its probe found it)."""
    answer = {"path": expect["path"], "bytes": expect["bytes"]}
    if "replacements" in expect:
        answer["replacements"] = expect["replacements"]
    return answer


def _edited(text: str, plan: dict) -> tuple[str, int]:
    """``text`` with the edit applied, and how many places it changed.

    Raises:
        ToolFailed: the edit's texts are not usable, or ``old_text`` is not found exactly once
            (without ``replace_all``).
    """
    old, new = plan.get("old_text"), plan.get("new_text")
    if not isinstance(old, str) or not old or not isinstance(new, str):
        raise refused("`old_text` must be non-empty text and `new_text` text")
    if old == new:
        raise refused("`old_text` and `new_text` are the same; there is nothing to change")
    count = text.count(old)
    if count == 0:
        raise refused("`old_text` is not in the file; read it again and give its exact text")
    if count > 1 and plan.get("replace_all") is not True:
        raise refused(
            f"`old_text` is in the file {count} times; give more of the text around it, or "
            "`replace_all: true` to change every one"
        )
    return (text.replace(old, new) if count > 1 else text.replace(old, new, 1)), count


def _text(confined: Confinement, target, found) -> str:
    if found is None:
        raise refused(f"there is no file {target.shown!r} to edit (`write` makes one)")
    data, size = found
    if size > EDIT_FILE_BYTES:
        raise refused(f"{target.shown!r} is over {EDIT_FILE_BYTES} bytes, more than an edit loads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise refused(f"{target.shown!r} is not UTF-8 text") from None


def plan_change(confined: Confinement, plan: dict) -> dict:
    """The plan of a write or an edit: the resolved path, ``before``, ``after``, the size it
    leaves, and for an edit how many places it changes.

    Raises:
        ToolFailed: the path may not be written, or the change cannot be made as asked.
    """
    target = confined.writable(plan.get("path"))
    found = confined.read_bytes(target, EDIT_FILE_BYTES + 1)
    before = None if found is None else _digest_of(confined, target, found)
    if plan["tool"] == "write":
        content = plan.get("content")
        if content is None:
            raise refused("`content` must be text")
        return {"path": target.rel, "before": before, "after": content["sha256"],
                "bytes": content["bytes"]}  # fmt: skip
    text, count = _edited(_text(confined, target, found), plan)
    data = text.encode("utf-8")
    return {"path": target.rel, "before": before, "after": digest(data), "bytes": len(data),
            "replacements": count}  # fmt: skip


def _digest_of(confined: Confinement, target, found: tuple[bytes, int]) -> str:
    data, size = found
    if size <= len(data):
        return digest(data)
    held = confined.held_digest(target)  # past what a plan loads: hashed whole
    return held if held is not None else digest(b"")


def perform_change(confined: Confinement, tool: str, tool_input: dict) -> dict:
    """Make the planned change (``tool_input["expect"]``), unless the file already holds it.

    Raises:
        ToolFailed: the file holds neither what the plan found nor what it intends.
    """
    expect = tool_input["expect"]
    target = confined.writable(expect["path"])
    found = confined.read_bytes(target)
    held = None if found is None else digest(found[0])
    if held == expect["after"]:
        return written(expect)
    if held != expect["before"]:
        raise refused(
            f"{target.shown!r} changed since this {tool} was planned; nothing was written "
            "(read it again)"
        )
    if tool == "write":
        data = tool_input["content"].encode("utf-8")
    else:
        data = _edited(found[0].decode("utf-8"), tool_input)[0].encode("utf-8")
    if digest(data) != expect["after"]:
        raise refused(f"the {tool} would not leave the bytes it planned; nothing was written")
    confined.replace(target, data)
    kill_if_requested(tool)
    return written(expect)


def file_holds(confined: Confinement, probe_input: dict) -> dict:
    """Whether the planned change ``probe_input["expect"]`` landed: ``landed`` true with what
    the write answers, false when the file still holds ``before``, null (cannot tell) else."""
    expect = probe_input["expect"]
    held = confined.held_digest(confined.resolve(expect["path"]))
    if held == expect["after"]:
        return {"landed": True, "output": written(expect)}
    if held == expect["before"]:
        return {"landed": False}
    return {"landed": None, "held": held}
