"""The client's side of authoring over a link: the ``client_files`` a remote run's result hands
back (what its ``flow_write`` and ``flow_agents`` write saved for this machine), written into
the project by the client's rules.

A file is written only when its path has no ``..`` and lies directly in the ``.salvor/flows``
directory (a ``.yaml`` file) or the ``.salvor/agents`` directory (a ``.md`` or ``.toml`` file) of
the project of the flow this call ran; it replaces the file in one rename. A link in place of
the file, of the directory or of ``.salvor``, or a path that is there and is not a regular file,
is refused, and so is everything else: each refusal is a sentence naming the path, and the
command then exits 1. The daemon is not trusted to name a path: a hostile one gets nothing
written outside those two directories.
"""

from __future__ import annotations

import contextlib
import os
import posixpath

from salvor.protocol import project_of

from ..graphs import FlowFiles

# Where each kind of file goes under <project>/.salvor, by its suffix.
_HOMES = {".yaml": "flows", ".md": "agents", ".toml": "agents"}
from ._baselines import not_replaceable, replace_file


def _projects(files: FlowFiles | None) -> set[str]:
    """The projects this call's flow lies in, by the path it was run by and by its real path."""
    if files is None:
        return set()
    found = {project_of(files.bundle.path), project_of(files.bundle.canonical)}
    return {project for project in found if project is not None}


def _home(path: str, projects: set[str]) -> tuple[str, str] | str:
    """The project and the directory ``path`` belongs in, or the reason it belongs nowhere."""
    if not projects:
        return "this call ran no flow of a project, so no file is written for it"
    if not posixpath.isabs(path) or ".." in path.split("/"):
        return "only an absolute path without .. is written"
    suffix = posixpath.splitext(path)[1]
    if suffix not in _HOMES:
        return "only a .yaml flow or a .md or .toml agent is written"
    directory = posixpath.dirname(path)
    for project in projects:
        if directory == posixpath.join(project, ".salvor", _HOMES[suffix]):
            return project, directory
    wanted = f".salvor/{_HOMES[suffix]}"
    return f"it is not directly in the {wanted} directory of this flow's project"


def _refusal(path: str, project: str, directory: str) -> str | None:
    """Why ``path`` may not be written now, or None (its directory made when missing)."""
    salvor = posixpath.join(project, ".salvor")
    for place in (salvor, directory):
        if os.path.islink(place):
            return f"{place} is a link; a file is written only into the directory itself"
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o755)
    real = posixpath.join(os.path.realpath(project), ".salvor", posixpath.basename(directory))
    if os.path.islink(directory) or os.path.realpath(directory) != real:
        return f"{directory} is a link; a file is written only into the directory itself"
    return not_replaceable(path, "a file")


def write_client_files(
    files: FlowFiles | None, writes: dict[str, bytes]
) -> tuple[list[str], dict[str, str]]:
    """Write each file a remote run saved for this machine by the client's rules: the paths
    written, and the reason for each path refused. A refused file leaves its path as it was."""
    projects = _projects(files)
    written, refused = [], {}
    for path, data in sorted(writes.items()):
        home = _home(path, projects)
        if isinstance(home, str):
            refused[path] = home
            continue
        try:
            reason = _refusal(path, *home)
        except OSError as exc:
            reason = exc.strerror or str(exc)
        if reason is None:
            reason = replace_file(path, data)
        if reason is None:
            written.append(path)
        else:
            refused[path] = reason
    return written, refused
