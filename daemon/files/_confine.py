"""Every path a file tool touches, held inside the workspace and the agent's access globs, or
inside one of the agent's skill folders (read whole, never written).

A path is resolved first (``os.path.realpath``: every symbolic link and ``..`` followed), then
checked: inside a skill folder, or inside the workspace and then against the globs; a link in a
skill folder that leads out of it is held to wherever it leads. What is opened is the resolved
path, with ``O_NOFOLLOW`` on its last component, and the descriptor is checked again through
``/proc/self/fd``: a link swapped in between the check and the open is refused, never followed.
A write goes to a temporary file in the same folder (held open by a descriptor checked the same
way) and is renamed over the target, so the target holds its old bytes or its new ones, never a
part, and a crash mid-write leaves nothing a probe cannot tell.

Synchronous: the tools call these from a worker thread (``trio.to_thread``). Every refusal is a
``ToolFailed`` that retrying cannot help, told to the agent as its call's error.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from dataclasses import dataclass

from ..tools import ToolFailed, Workspace
from ._access import FileAccess

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def refused(message: str) -> ToolFailed:
    return ToolFailed(message, retryable=False)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Zone:
    """A folder the file tools reach: the workspace, held to the agent's ``access`` globs, or a
    skill's folder (``access`` None), which the agent reads whole and never writes."""

    root: str
    access: FileAccess | None = None

    def holds(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)

    def may_read(self, rel: str) -> bool:
        return self.access is None or self.access.may_read(rel)

    def may_look_in(self, rel: str) -> bool:
        return self.access is None or self.access.may_look_in(rel)

    def shown(self, rel: str) -> str:
        """How a path of this zone is told to the agent: relative to the workspace, or (a skill's
        folder) absolute, the way its location was advertised."""
        if self.access is None:
            return os.path.join(self.root, rel) if rel else self.root
        return rel or "."


@dataclass(frozen=True, slots=True)
class Target:
    """A resolved path: ``real``, absolute with no link in it, and ``rel``, the same path
    relative to its zone's root ("" for the root itself); ``zone`` None: the workspace."""

    real: str
    rel: str
    zone: Zone | None = None

    @property
    def shown(self) -> str:
        return self.rel or "." if self.zone is None else self.zone.shown(self.rel)


def _descriptor_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _path(path: object) -> str:
    if not isinstance(path, str) or path == "" or "\0" in path:
        raise refused("`path` must be a non-empty path")
    return path


class Confinement:
    """The workspace, one agent's access and its skill folders: the only way its file tools
    reach a file. Without a workspace (``workspace`` None) only the skill folders are read."""

    def __init__(
        self,
        workspace: Workspace | None,
        access: FileAccess,
        skill_folders: tuple[str, ...] = (),
    ) -> None:
        # Resolved here too: a root given with a link in it would refuse every resolved path.
        self.root = None if workspace is None else os.path.realpath(workspace.root)
        self.access = access
        self.workspace = None if self.root is None else Zone(self.root, access)
        self.skills = tuple(Zone(os.path.realpath(folder)) for folder in skill_folders)

    def resolve(self, path: object) -> Target:
        """Where ``path`` (relative to the workspace, or absolute) really leads, in the workspace.

        Raises:
            ToolFailed: not a path, no workspace, or it leads outside the workspace.
        """
        path = _path(path)
        if self.root is None:
            raise refused(
                "this daemon has no workspace, so the file tools reach only this agent's skill "
                "folders, and only to read (the operator gives one with --workspace)"
            )
        real = os.path.realpath(os.path.join(self.root, path))
        if real != self.root and not real.startswith(self.root + os.sep):
            raise refused(
                f"{path!r} leads outside the workspace (links and `..` are followed before the "
                "check); the file tools reach only the workspace"
                + (" and this agent's skill folders" if self.skills else "")
            )
        rel = "" if real == self.root else os.path.relpath(real, self.root)
        return Target(real, rel)

    def locate(self, path: object) -> Target:
        """Where ``path`` really leads, for a read: in one of the agent's skill folders (an
        absolute path, or one relative to the workspace leading there), else in the workspace.

        Raises:
            ToolFailed: not a path, or it leads outside the skill folders and the workspace.
        """
        path = _path(path)
        found: str | None = None
        if self.skills and os.path.isabs(path):
            found = os.path.realpath(path)
        elif self.skills and self.root is not None:
            found = os.path.realpath(os.path.join(self.root, path))
        for zone in self.skills:
            if found is not None and zone.holds(found):
                rel = "" if found == zone.root else os.path.relpath(found, zone.root)
                return Target(found, rel, zone)
        if self.root is None:
            raise refused(
                f"{path!r} is not in this agent's skill folders (links and `..` are followed "
                "before the check); without a workspace the file tools read only those, by "
                "absolute path"
            )
        return self.resolve(path)

    def zone_of(self, target: Target) -> Zone:
        return target.zone or self.workspace

    def readable(self, path: object) -> Target:
        """``path`` resolved, if the agent may read it.

        Raises:
            ToolFailed: outside the workspace and the skill folders, or not among the agent's
                read globs.
        """
        target = self.locate(path)
        if not self.zone_of(target).may_read(target.rel):
            raise refused(f"{target.shown!r} is not among the paths this agent may read")
        return target

    def folder(self, path: object) -> Target:
        """``path`` resolved, if it is a folder the agent may look in (``may_look_in``).

        Raises:
            ToolFailed: outside the workspace and the skill folders, not a folder, or nothing in
                it is readable.
        """
        target = self.locate(path)
        if not os.path.isdir(target.real):
            raise refused(f"{target.shown!r} is not a folder")
        if not self.zone_of(target).may_look_in(target.rel):
            raise refused(f"nothing in {target.shown!r} is among the paths this agent may read")
        return target

    def writable(self, path: object) -> Target:
        """``path`` resolved, if the agent may write it.

        Raises:
            ToolFailed: outside the workspace, not among the agent's write globs, or a folder.
        """
        target = self.resolve(path)
        if not self.access.may_write(target.rel):
            raise refused(
                f"{target.shown!r} is not among the paths this agent may write (its definition's "
                "`access.write` globs)"
            )
        if os.path.isdir(target.real):
            raise refused(f"{target.shown!r} is a folder")
        return target

    def _checked(self, fd: int, target: Target) -> int:
        if _descriptor_path(fd) != target.real:
            os.close(fd)
            raise refused(f"{target.shown!r} changed while it was opened; nothing was done")
        return fd

    def open_file(self, target: Target) -> int | None:
        """A descriptor of the regular file at ``target``, or None when there is none.

        Raises:
            ToolFailed: it became a link (or moved) since it was resolved, or is no regular file.
        """
        try:
            fd = os.open(target.real, _READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise refused(f"{target.shown!r} cannot be opened: {exc.strerror}") from None
        self._checked(fd, target)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise refused(f"{target.shown!r} is not a regular file")
        return fd

    def read_bytes(self, target: Target, limit: int | None = None) -> tuple[bytes, int] | None:
        """Up to ``limit`` bytes of the file (all of it for None) and its whole size; None when
        there is no file."""
        fd = self.open_file(target)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            return (file.read() if limit is None else file.read(limit)), size

    def held_digest(self, target: Target) -> str | None:
        """The digest of what the file holds now; None when there is no file."""
        found = self.read_bytes(target)
        return None if found is None else digest(found[0])

    def replace(self, target: Target, data: bytes) -> None:
        """Make the file at ``target`` hold ``data``: whole, durable, its mode kept.

        Raises:
            ToolFailed: its folder cannot be made or changed while it was opened.
        """
        parent, name = os.path.split(target.real)
        try:
            os.makedirs(parent, exist_ok=True)
            folder = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise refused(
                f"the folder of {target.shown!r} cannot be used: {exc.strerror}"
            ) from None
        try:
            self._checked(folder, Target(parent, os.path.relpath(parent, self.root)))
            _replace_in(folder, name, data)
        finally:
            os.close(folder)


def _replace_in(folder: int, name: str, data: bytes) -> None:
    """Write ``data`` to a fresh file in ``folder`` and rename it to ``name``, both fsynced."""
    try:
        kept: int | None = stat.S_IMODE(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        kept = None  # a new file: 0666 less the umask, as any
    temporary = f".{name}.salvor-{secrets.token_hex(6)}"
    fd = os.open(
        temporary,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o666,
        dir_fd=folder,
    )
    try:
        if kept is not None:
            os.fchmod(fd, kept)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=folder)
        except OSError:
            pass
        raise
    os.fsync(folder)
