"""A flow bundle: a flow file and the files it reaches, keyed the way a walk looks them up.

A flow is a graph document file in a project (``<P>/.salvor/flows/<name>.yaml``, or any path).
Its nodes may name agent files (``agent_file``), an agent file its prompt file
(``system_prompt_path``), and a ``flow`` node another flow of the project by name. The client
collects those files (its *members*) before a run; the daemon never opens a client path again: it
finds each member by its key.

Rules:
* A member's key is the real directory of the file that names it, a NUL, and the target as
  written (``member_key``); a nested flow's is ``<P>/.salvor/flows``, a NUL and ``<name>.yaml``;
  a tool file's (role ``tool``, ``_tool_files``) and a baseline's is the absolute path itself.
  Paths here are the client's and are only joined as text (``posixpath``), never opened.
* A member has its bytes (``sha256`` and ``size``) or a state: ``missing`` (nothing at the path),
  ``refused`` (the client would not send it; ``error`` says why) or ``listed`` (named only).
* The manifest (``to_json``) is canonical JSON; its hash names the bundle in a run's head, and the
  bytes of every member and of the manifest are kept content-addressed with the run.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._canonical import canonical_json, sha256_hash
from ._tool_files import declared_arguments

# Agent files and nested flows reached from one flow, counted together along one chain.
MAX_FLOW_DEPTH = 20
# One member's bytes; the client refuses a bigger file and the daemon refuses its bytes.
MAX_MEMBER_BYTES = 32 * 1024 * 1024
# Where a project keeps its flows, relative to the project.
FLOWS_DIR = ".salvor/flows"
# A flow's name as a `flow` node writes it: a file name without its `.yaml`.
FLOW_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

MEMBER_ROLES = ("flow", "agent", "prompt", "baseline", "tool")
MEMBER_STATES = ("missing", "refused", "listed")
SPELLING_STATES = ("listed", "case_folded", "absent")


def content_hash(data: bytes) -> str:
    """``sha256:<hex>`` over a member's bytes as they are."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def member_key(directory: str, target: str) -> str:
    """The key of ``target`` as a file in the real directory ``directory`` names it."""
    return f"{directory}\0{target}"


def member_path(directory: str, target: str) -> str:
    """Where ``target`` lies beside ``directory``: joined as text (an absolute target wins)."""
    return posixpath.normpath(posixpath.join(directory, target))


def is_flow_name(name: str) -> bool:
    """True for a name a ``flow`` node may give (``<name>.yaml`` is then a plain file name)."""
    return bool(FLOW_NAME.match(name)) and ".." not in name


def nested_flow_key(project: str, name: str) -> str:
    """The key of the flow ``name`` of project ``project``."""
    return member_key(posixpath.join(project, FLOWS_DIR), f"{name}.yaml")


def project_of(*paths: str) -> str | None:
    """The project ``P`` of a flow file under ``<P>/.salvor/flows/``: of the first of ``paths``
    (its path as given, then its real path) that lies there, else None."""
    for path in paths:
        directory = posixpath.dirname(path)
        if posixpath.basename(directory) == "flows":
            parent = posixpath.dirname(directory)
            if posixpath.basename(parent) == ".salvor":
                return posixpath.dirname(parent)
    return None


BASELINES_DIR = "__baselines__"


def baseline_dir(path: str, canonical: str, *, stem: str | None = None) -> str:
    """The directory of a flow's baselines: ``__baselines__/<stem>`` beside its real file, the
    stem that of its real file (or of its path when that is no flow name), or ``stem``."""
    if stem is None:
        stem = posixpath.splitext(posixpath.basename(canonical))[0]
        if not is_flow_name(stem):
            stem = posixpath.splitext(posixpath.basename(path))[0]
    return posixpath.join(posixpath.dirname(canonical), BASELINES_DIR, stem)


def baseline_path(path: str, canonical: str, name: str, *, stem: str | None = None) -> str:
    """The baseline file of snapshot ``name`` of the flow at ``path`` (real file ``canonical``)."""
    return posixpath.join(baseline_dir(path, canonical, stem=stem), f"{name}.json")


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowMember:
    """One file a flow reaches, as the client found it."""

    key: str
    role: str
    path: str
    canonical: str
    spelling: dict = field(default_factory=lambda: {"state": "listed"})
    sha256: str | None = None
    size: int | None = None
    state: str | None = None
    error: str | None = None

    def to_json(self) -> dict:
        body: dict[str, Any] = {
            "key": self.key,
            "role": self.role,
            "path": self.path,
            "canonical": self.canonical,
            "spelling": self.spelling,
        }
        for name in ("sha256", "size", "state", "error"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        return body


class MalformedBundle(ValueError):
    """A manifest that is not the shape; the message names the first problem."""


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MalformedBundle(f"{where} must be a string")
    return value


def _spelling(value: Any, where: str) -> dict:
    if not isinstance(value, dict) or value.get("state") not in SPELLING_STATES:
        raise MalformedBundle(f"{where} must be a spelling ({', '.join(SPELLING_STATES)})")
    if value["state"] == "case_folded":
        _text(value.get("actual"), f"{where}.actual")
        if not isinstance(value.get("addressable"), bool):
            raise MalformedBundle(f"{where}.addressable must be a boolean")
    return value


def member_from_json(value: Any, where: str) -> FlowMember:
    """A member as a manifest holds it.

    Raises:
        MalformedBundle: it is not the shape (a member with neither bytes nor a state, an
            unknown role or state, a refusal without its reason).
    """
    if not isinstance(value, dict):
        raise MalformedBundle(f"{where} must be an object")
    role = value.get("role")
    if role not in MEMBER_ROLES:
        raise MalformedBundle(f"{where}.role must be one of {', '.join(MEMBER_ROLES)}")
    state, digest = value.get("state"), value.get("sha256")
    if state is not None and state not in MEMBER_STATES:
        raise MalformedBundle(f"{where}.state must be one of {', '.join(MEMBER_STATES)}")
    if (state is None) == (digest is None):
        raise MalformedBundle(f"{where} has either its bytes (sha256) or a state")
    if state == "refused":
        _text(value.get("error"), f"{where}.error")
    size = value.get("size")
    if digest is not None and (type(size) is not int or not 0 <= size <= MAX_MEMBER_BYTES):
        raise MalformedBundle(f"{where}.size must be a byte count up to {MAX_MEMBER_BYTES}")
    return FlowMember(
        key=_text(value.get("key"), f"{where}.key"),
        role=role,
        path=_text(value.get("path"), f"{where}.path"),
        canonical=_text(value.get("canonical"), f"{where}.canonical"),
        spelling=_spelling(value.get("spelling", {"state": "listed"}), f"{where}.spelling"),
        sha256=None if digest is None else _text(digest, f"{where}.sha256"),
        size=size if digest is not None else None,
        state=state,
        error=value.get("error") if state == "refused" else None,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowBundle:
    """A flow file (its path, real path, spelling and bytes' hash) and its members by key.

    ``linked`` says the bundle came over a link (a process agent is then refused).
    """

    path: str
    canonical: str
    spelling: dict
    document: str
    members: dict[str, FlowMember]
    update_baselines: bool = False
    linked: bool = False
    # A nested flow's baselines go under the id of the node that runs it, not its file's stem.
    stem: str | None = None

    @property
    def project(self) -> str | None:
        """The project whose flows a ``flow`` node of this flow names, or None."""
        return project_of(self.path, self.canonical)

    def to_json(self) -> dict:
        """The manifest: what a run's head names by ``manifest_hash``."""
        return {
            "path": self.path,
            "canonical": self.canonical,
            "spelling": self.spelling,
            "document": self.document,
            "members": [self.members[key].to_json() for key in sorted(self.members)],
            "update_baselines": self.update_baselines,
            "linked": self.linked,
            "stem": self.stem,
        }

    def baseline_path(self, name: str) -> str:
        """Where snapshot ``name`` of this flow keeps its baseline (``baseline_path``)."""
        return baseline_path(self.path, self.canonical, name, stem=self.stem)

    def manifest_bytes(self) -> bytes:
        return canonical_json(self.to_json())

    def manifest_hash(self) -> str:
        return sha256_hash(self.to_json())


def bundle_from_json(value: Any) -> FlowBundle:
    """The bundle a manifest describes; a member repeating a key is ignored after the first.

    Raises:
        MalformedBundle: it is not the shape.
    """
    if not isinstance(value, dict):
        raise MalformedBundle("the flow manifest must be an object")
    raw_members = value.get("members", [])
    if not isinstance(raw_members, list):
        raise MalformedBundle("members must be a list")
    members: dict[str, FlowMember] = {}
    for index, raw in enumerate(raw_members):
        member = member_from_json(raw, f"members[{index}]")
        members.setdefault(member.key, member)
    return FlowBundle(
        path=_text(value.get("path"), "path"),
        canonical=_text(value.get("canonical"), "canonical"),
        spelling=_spelling(value.get("spelling", {"state": "listed"}), "spelling"),
        document=_text(value.get("document"), "document"),
        members=members,
        update_baselines=value.get("update_baselines") is True,
        linked=value.get("linked") is True,
        stem=value.get("stem") if isinstance(value.get("stem"), str) else None,
    )


def names_files(nodes: Any, file_inputs: Mapping[str, Sequence[str]] | None = None) -> bool:
    """True when a graph's nodes name files (an ``agent_file``, a ``flow``, a snapshot's or a
    pinned agent's baseline, an argument of a tool's declared file input: ``file_inputs``, tool
    name -> its arguments): it runs only as a flow run, from its flow file and the files sent
    with it."""
    for node in nodes:
        call = node.body if node.body is not None else node
        if call.agent_file is not None or call.flow is not None or call.of is not None:
            return True
        if call.pinned:
            return True
        if file_inputs and declared_arguments(call, file_inputs):
            return True
    return False
