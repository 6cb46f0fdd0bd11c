"""The client side of a flow run: the files a flow file reaches, collected from this machine.

Starting at the flow file, every ``agent_file`` of its nodes (a map's body too) is a member keyed
by the real directory of the file that names it and the target as written; an agent file's
``system_prompt_path`` likewise beside the agent file; every ``flow`` node's flow of the project
(``<P>/.salvor/flows/<name>.yaml``) a member keyed by that directory and ``<name>.yaml``, collected
in the same way. Each (directory, target) pair is read once; a chain stops at ``MAX_FLOW_DEPTH``.
Every tool node's file arguments (``protocol._tool_files``), in every flow found, are members of
role ``tool`` keyed by the path as written, each path once.

The client policy: a member is sent only when its real path lies under one of the roots (the
project and its ``.salvor/flows``, the flow file's directory and its real file's directory), by
their real location; otherwise it is refused with a sentence saying why, the root check first (a
missing file outside every root is refused, not missing). ``SALVOR_FLOW_FILES_LOG=1`` prints one
line a member on stderr once all are found (over a link, whether its bytes go inline or by
upload), never its content.

Runs in a thread (blocking file IO): ``collect_flow`` is synchronous.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import sys
import tomllib
from dataclasses import dataclass, field
from typing import Any

from salvor.protocol import (
    FLOWS_DIR,
    MAX_FLOW_DEPTH,
    MAX_MEMBER_BYTES,
    TOOL_FILE_SUFFIXES,
    FileInputs,
    FlowBundle,
    FlowMember,
    baseline_dir,
    content_hash,
    is_file_argument,
    is_flow_name,
    member_key,
    nested_flow_key,
    project_of,
)

from ..agents import read_markdown
from ..graphs import FlowFiles
from ._flow_uploads import placements

LOG_VAR = "SALVOR_FLOW_FILES_LOG"

# What a name's suffix says the file is; a link from such a name must lead to the same kind.
_KINDS = {
    ".yaml": "YAML",
    ".yml": "YAML",
    ".toml": "TOML",
    ".md": "markdown",
    ".markdown": "markdown",
    ".json": "JSON",
}


def _spelling(path: str) -> dict:
    """How the directory of ``path`` lists its basename (``listed`` when it cannot be read)."""
    directory, name = os.path.split(path)
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return {"state": "listed"}
    if name in names:
        return {"state": "listed"}
    folded = next((n for n in names if n.casefold() == name.casefold()), None)
    if folded is None:
        return {"state": "absent"}
    stem, suffix = os.path.splitext(folded)
    return {
        "state": "case_folded",
        "actual": folded,
        "addressable": suffix == ".yaml" and is_flow_name(stem),
    }


def _os_error(exc: OSError) -> str:
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    return f"{code}: {exc.strerror or exc}"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def flow_files_line(text: str, as_json: bool) -> None:
    """Print one ``SALVOR_FLOW_FILES_LOG=1`` line on stderr: as it reads, or under ``--json`` as
    the warning object the command line's other JSON warnings are (``{"warning": text}``)."""
    shown = json.dumps({"warning": text}, ensure_ascii=False) if as_json else text
    print(shown, file=sys.stderr, flush=True)


@dataclass
class _Collector:
    roots: list[str]
    # The tools' declared file inputs (tool name -> arguments): which tool arguments are files.
    file_inputs: FileInputs = field(default_factory=dict)
    members: dict[str, FlowMember] = field(default_factory=dict)
    # The baseline directories of the runs that update theirs: where the client may write.
    updating: set[str] = field(default_factory=set)
    contents: dict[str, bytes] = field(default_factory=dict)
    # The members in the order they were found: what ``SALVOR_FLOW_FILES_LOG=1`` prints.
    logged: list[FlowMember] = field(default_factory=list)

    def read(self, role: str, key: str, path: str, target: str) -> FlowMember:
        """The member ``key`` (``path`` on this machine), read once, under the client policy.

        A baseline an updating run listed by name is read when a comparing run needs it: the
        two share a directory, and the comparing one reads its bytes."""
        known = self.members.get(key)
        if known is not None and known.state != "listed":
            return known
        member = self._member(role, key, path, target)
        self.members[key] = member
        if known is None:
            self.logged.append(member)
        else:
            self.logged[self.logged.index(known)] = member
        return member

    def print_log(self, uploaded: dict[str, bool] | None, as_json: bool) -> None:
        """One line a member, in the order they were found, never content: a member with bytes
        says how it travels (``uploaded``: by digest, whether it goes by upload; None: inline);
        ``as_json``: each line a JSON warning object (``flow_files_line``)."""
        for member in self.logged:
            if member.sha256 is not None:
                how = "upload" if (uploaded or {}).get(member.sha256) else "inline"
                line = f"{how} {member.size}"
            elif member.state == "refused":
                line = f"refused ({member.error})"
            else:
                line = str(member.state)
            shown = member.key if member.role in ("baseline", "tool") else member.canonical
            flow_files_line(f"[flow-files] {member.role} {shown}: {line}", as_json)

    def baselines(self, directory: str, names: list[str], update: bool) -> None:
        """The baselines of one run's snapshots and pinned agents (``names``: their file names;
        ``update``: whether that run updates them): their bytes when comparing; when updating,
        each ``.json`` file the directory holds by name only, and the directory is one the client
        writes the run's captures into."""
        paths = [posixpath.join(directory, name) for name in names]
        if not update:
            for path in paths:
                self.read("baseline", path, path, path)
            return
        self.updating.add(directory)
        with contextlib.suppress(OSError):
            paths += [
                posixpath.join(directory, name)
                for name in sorted(os.listdir(directory))
                if name.endswith(".json")
            ]
        for path in dict.fromkeys(paths):
            if path in self.members:
                continue
            canonical = os.path.realpath(path)
            if not any(_under(canonical, root) for root in self.roots):
                self.read("baseline", path, path, path)  # refused, saying why
                continue
            if not os.path.lexists(path):
                continue  # nothing there yet: the run's capture writes it
            if not os.path.exists(path):
                # A link to nothing: the client would not write the capture through it.
                self.members[path] = FlowMember(
                    key=path,
                    role="baseline",
                    path=path,
                    canonical=canonical,
                    spelling=_spelling(path),
                    state="refused",
                    error=f"{path} links to nothing",
                )
                self.logged.append(self.members[path])
                continue
            self.members[path] = FlowMember(
                key=path, role="baseline", path=path, canonical=canonical, state="listed"
            )
            self.logged.append(self.members[path])

    def tool_files(self, node: dict) -> None:
        """The file arguments of a tool node (or a map's tool body) as the document writes them:
        each a member keyed by the path as written, read once (a baseline of the same path,
        collected first, is its member)."""
        tool, template = node.get("tool"), node.get("input")
        if not isinstance(tool, str) or not isinstance(template, dict):
            return
        for argument in self.file_inputs.get(tool, ()):
            value = template.get(argument)
            if is_file_argument(value):
                self.read("tool", value, value, value)

    def _member(self, role: str, key: str, path: str, target: str) -> FlowMember:
        canonical = os.path.realpath(path)
        base = {"key": key, "role": role, "path": path, "canonical": canonical}
        spelling = _spelling(path)

        def refused(reason: str) -> FlowMember:
            return FlowMember(**base, spelling=spelling, state="refused", error=reason)

        if not any(_under(canonical, root) for root in self.roots):
            shown = ", ".join(self.roots)
            return refused(f"{target} is outside every root this client serves ({shown})")
        kind = _KINDS.get(os.path.splitext(path)[1].lower())
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return FlowMember(**base, spelling=spelling, state="missing")
        except OSError as exc:
            return refused(_os_error(exc))
        if role == "tool":
            if not canonical.lower().endswith(TOOL_FILE_SUFFIXES):
                shown = ", ".join(TOOL_FILE_SUFFIXES)
                return refused(f"{target} links to a file that is not one of {shown}")
        elif kind is not None and _KINDS.get(os.path.splitext(canonical)[1].lower()) != kind:
            return refused(f"{target} links to a file that is not a {kind} file")
        if os.path.isdir(canonical):
            return refused("EISDIR: illegal operation on a directory, read")
        if info.st_size > MAX_MEMBER_BYTES:
            return refused(
                f"{canonical} is larger than the 32 MiB cap on a file sent to the daemon"
            )
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_MEMBER_BYTES + 1)
        except OSError as exc:
            return refused(_os_error(exc))
        if len(data) > MAX_MEMBER_BYTES:
            return refused(
                f"{canonical} is larger than the 32 MiB cap on a file sent to the daemon"
            )
        digest = content_hash(data)
        self.contents[digest] = data
        return FlowMember(**base, spelling=spelling, sha256=digest, size=len(data))


def _nodes(document: Any) -> list[dict]:
    """The node objects of a parsed flow document (a map's body counted), leniently: the
    daemon's checks say what is wrong with a document, the collector only finds names."""
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list):
        return []
    found = []
    for node in document["nodes"]:
        if isinstance(node, dict):
            found.append(node)
            if isinstance(node.get("body"), dict):
                found.append(node["body"])
    return found


def _parse_document(data: bytes, name: str) -> Any:
    from salvor.protocol import load_yaml_lines, parse_strict

    try:
        text = data.decode("utf-8")
        if name.lower().endswith(".json"):
            return parse_strict(text, "the flow file")
        return load_yaml_lines(text, "the flow file")[0]
    except Exception:  # noqa: BLE001 - any unreadable document is the daemon's to report
        return None


def _prompt_target(data: bytes, name: str) -> str | None:
    """The ``system_prompt_path`` an agent file names, if it names one and reads at all."""
    try:
        text = data.decode("utf-8")
        suffix = os.path.splitext(name)[1].lower()
        if suffix in (".md", ".markdown"):
            raw: Any = read_markdown(text).fields
        elif suffix == ".json":
            raw = json.loads(text)
        else:
            raw = tomllib.loads(text)
    except Exception:  # noqa: BLE001 - the daemon's pre-check reports an agent file that fails
        return None
    target = raw.get("system_prompt_path") if isinstance(raw, dict) else None
    return target if isinstance(target, str) else None


def _walk(
    collector: _Collector,
    member: FlowMember,
    project: str | None,
    depth: int,
    seen: set,
    update: bool,
    stem: str | None = None,
) -> None:
    """Collect what the flow ``member`` (its bytes read) names, one level below ``depth``;
    ``update``: whether this run updates its baselines; ``stem``: the node id its baselines go
    under (a nested flow's)."""
    data = collector.contents.get(member.sha256 or "")
    if data is None:
        return
    directory = posixpath.dirname(member.canonical)
    snapshots = []
    nodes = _nodes(_parse_document(data, member.canonical))
    for node in nodes:
        target = node.get("agent_file")
        if isinstance(target, str) and depth < MAX_FLOW_DEPTH:
            key = member_key(directory, target)
            if key not in seen:
                seen.add(key)
                agent = collector.read("agent", key, posixpath.join(directory, target), target)
                _collect_prompt(collector, agent)
        if node.get("kind") == "snapshot" and isinstance(node.get("name"), str):
            snapshots.append(f"{node['name']}.json")
        pinned = node.get("kind") == "agent" and node.get("pinned") is True
        if pinned and isinstance(node.get("id"), str) and is_flow_name(node["id"]):
            snapshots.append(f"{node['id']}.calls.json")
        name = node.get("flow") if node.get("kind") == "flow" else None
        if isinstance(name, str) and project is not None and depth < MAX_FLOW_DEPTH:
            if not is_flow_name(name):
                continue
            key = nested_flow_key(project, name)
            node_id = node.get("id") if isinstance(node.get("id"), str) else name
            # Its own setting, else the run that starts it decides (the daemon's rule too).
            nested_update = node.get("update_baselines")
            if not isinstance(nested_update, bool):
                nested_update = update
            # Each node running the flow is a run of its own, with its baselines under its id:
            # the flow is read once, and walked once per node (and way of holding baselines).
            if (key, node_id, nested_update) in seen:
                continue
            seen.add((key, node_id, nested_update))
            path = posixpath.join(project, FLOWS_DIR, f"{name}.yaml")
            nested = collector.read("flow", key, path, f"{name}.yaml")
            _walk(collector, nested, project, depth + 1, seen, nested_update, node_id)
    if snapshots:
        directory = baseline_dir(member.path, member.canonical, stem=stem)
        collector.baselines(directory, snapshots, update)
    # After the baselines: a tool file at a baseline's path is that baseline's member (listed
    # only, in a run that updates it, so the client still writes it there).
    for node in nodes:
        collector.tool_files(node)


def _collect_prompt(collector: _Collector, agent: FlowMember) -> None:
    data = collector.contents.get(agent.sha256 or "")
    target = None if data is None else _prompt_target(data, agent.canonical)
    if target is not None:
        directory = posixpath.dirname(agent.canonical)
        path = posixpath.join(directory, target)
        collector.read("prompt", member_key(directory, target), path, target)


def flow_roots(path: str) -> list[str]:
    """The directories this client sends files from for the flow file ``path``, real paths."""
    absolute = os.path.abspath(path)
    canonical = os.path.realpath(path)
    roots = [os.path.dirname(absolute), os.path.dirname(canonical)]
    for project in (project_of(absolute), project_of(canonical)):
        if project is not None:
            roots += [project, posixpath.join(project, FLOWS_DIR)]
    real = [os.path.realpath(root) for root in roots]
    return list(dict.fromkeys(real))


def collect_flow(
    path: str,
    *,
    update_baselines: bool = False,
    over_link: bool = False,
    file_inputs: FileInputs | None = None,
    as_json: bool = False,
) -> FlowFiles:
    """The flow file ``path`` and every member it reaches, as this machine holds them.

    ``file_inputs``: the tools' declared file inputs (tool name -> arguments; the daemon's
    ``GET /v1/tools`` over a link): each tool node's file arguments are sent as ``tool`` members.

    ``over_link``: the members go to a daemon in a call (``_flow_uploads``), so each line of
    ``SALVOR_FLOW_FILES_LOG=1`` says whether its bytes go inline or by upload, as that call
    will send them; otherwise they are read here, inline. ``as_json``: those lines are JSON
    warning objects (the command's ``--json``).

    Raises:
        OSError: the flow file itself cannot be read (nothing else raises: a member that cannot
            be read is refused or missing, for the daemon's pre-check to report).
    """
    absolute = os.path.abspath(path)
    canonical = os.path.realpath(path)
    with open(absolute, "rb") as handle:
        document = handle.read(MAX_MEMBER_BYTES + 1)
    if len(document) > MAX_MEMBER_BYTES:
        raise OSError(errno.EFBIG, "larger than the 32 MiB cap on a flow file")
    collector = _Collector(roots=flow_roots(path), file_inputs=file_inputs or {})
    digest = content_hash(document)
    collector.contents[digest] = document
    root = FlowMember(
        key="", role="flow", path=absolute, canonical=canonical, sha256=digest, size=len(document)
    )
    project = project_of(absolute, canonical)
    _walk(collector, root, project, 0, set(), update_baselines)
    bundle = FlowBundle(
        path=absolute,
        canonical=canonical,
        spelling=_spelling(absolute),
        document=digest,
        members=collector.members,
        update_baselines=update_baselines,
    )
    if os.environ.get(LOG_VAR) == "1":
        uploaded = placements(bundle, collector.contents) if over_link else None
        collector.print_log(uploaded, as_json)
    return FlowFiles(bundle, collector.contents, frozenset(collector.updating))
