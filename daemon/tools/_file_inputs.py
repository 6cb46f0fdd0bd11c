"""A tool's declared file inputs: the arguments whose whole value is the path of a file it reads.

In a flow, such an argument written as a literal absolute path is a file of the client's, which the
daemon hands the tool as a temporary copy (``graphs._tool_files``); ``GET /v1/tools`` lists them.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from typing import Any

# Where the daemon puts its copies: one directory per user, a directory per handing named after
# the process (``<pid>-<random>``), so a process killed mid-call leaves copies the next removes.
COPIES_PREFIX = "salvor-tool-files-"


def copies_home() -> str | None:
    """This user's directory of copies, made 0700; None when the name is taken by something
    else (another user's directory, a link), when each handing gets a directory of its own."""
    home = os.path.join(tempfile.gettempdir(), f"{COPIES_PREFIX}{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(home, 0o700)
    info = os.lstat(home)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return home


def handed_copy(path: str) -> bool:
    """Whether ``path`` is a copy the daemon made for a tool (a file in a handing's directory),
    not a path a caller chose: a tool that reads only such files reads no file of the daemon's."""
    directory = os.path.dirname(os.path.realpath(path))
    home = copies_home()
    if home is not None and os.path.dirname(directory) == os.path.realpath(home):
        return True
    parent = os.path.dirname(directory)
    return parent == os.path.realpath(tempfile.gettempdir()) and os.path.basename(
        directory
    ).startswith(COPIES_PREFIX)


# A file input names one top-level argument: the path is that argument's value alone (never a
# path built from two arguments, a dotted path into one, or a directory).
_ARGUMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


def check_file_inputs(where: str, value: Any, input_schema: Any = None) -> tuple[str, ...]:
    """Validate declared file inputs: distinct top-level argument names, each one the input
    schema (when it lists ``properties``) declares as a string.

    Raises:
        ValueError: one sentence naming ``where`` and the bad entry.
    """
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"{where} must be a non-empty array of argument names")
    properties = input_schema.get("properties") if isinstance(input_schema, dict) else None
    for name in value:
        if not isinstance(name, str) or not _ARGUMENT.match(name):
            raise ValueError(
                f"{where} holds {name!r}, which is not one argument's name: a file input is an "
                "argument whose whole value is the file's path"
            )
        if isinstance(properties, dict):
            declared = properties.get(name)
            if not isinstance(declared, dict) or declared.get("type") != "string":
                raise ValueError(
                    f"{where} names {name!r}, which the tool's input schema does not declare as "
                    "a string property"
                )
    if len(set(value)) != len(value):
        raise ValueError(f"{where} names one argument twice")
    return tuple(value)
