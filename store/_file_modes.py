"""A SQLite store's files are its user's alone: the state directory 0700, the store and its side
files 0600, from the moment each exists.

Other local users must not read runs (inputs, tool outputs, customer data) from the store file.
Modes are given at creation, never by a chmod after it, and without touching the process-wide
umask (other threads create files meanwhile):

* The state directory (the default store's; see ``default_store_url``) is created 0700. A
  directory the operator named for ``--store`` is theirs: it is never created (the command line
  refuses a missing one) nor changed.
* The database file is created empty with mode 0600 before SQLite opens it (an empty file is an
  empty database to SQLite), and SQLite creates its ``-wal``, ``-shm`` and ``-journal`` with the
  database file's mode. The lock file (``_ownership``) and the write-turn file
  (``_write_turns``) are opened 0600 too.

A store an older salvor left readable by others is tightened when it is opened: the files (and
the state directory) that belong to this user and give group or others any access get 0600
(0700), with a warning naming what changed. A file of another user is left as it is (and
SQLite then says whether it can be used).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from ._location import default_store_url, sqlite_path

log = logging.getLogger("salvor.store")

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600
# The write-turn file beside the store (``_write_turns``).
TURN_SUFFIX = ".write-turn"
# SQLite's side files, and salvor's lock files beside the store (``_ownership``, the turns).
SIDE_SUFFIXES = ("-wal", "-shm", "-journal", ".lock", TURN_SUFFIX)


def state_directory() -> Path | None:
    """The directory of the store salvor uses when none is named (``SALVOR_STORE`` aside)."""
    environ = {key: value for key, value in os.environ.items() if key != "SALVOR_STORE"}
    path = sqlite_path(default_store_url(environ))
    return path.parent if path is not None else None


def make_store_directory(directory: Path) -> None:
    """Create ``directory`` for a store (its parents as the umask says, itself 0700); tighten the
    state directory when it exists, is this user's and is open to others.

    Raises:
        OSError: it could not be created; nothing else was changed.
    """
    if not directory.exists():
        directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        return
    if directory.resolve() == _resolved(state_directory()):
        _tighten(directory, DIRECTORY_MODE)


def create_database_file(path: Path) -> None:
    """Create the (empty) database file 0600 when it does not exist, and tighten the store's
    existing files that are this user's and open to others.

    Raises:
        OSError: the file could not be created; nothing was.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        pass
    else:
        os.close(fd)
    for file in (path, *(path.with_name(path.name + suffix) for suffix in SIDE_SUFFIXES)):
        _tighten(file, FILE_MODE)


def _tighten(path: Path, mode: int) -> None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    if info.st_uid != os.geteuid() or not stat.S_IMODE(info.st_mode) & 0o077:
        return
    os.chmod(path, mode)
    log.warning(
        "%s was open to other users (mode %o); salvor made it %o, its user's alone",
        path,
        stat.S_IMODE(info.st_mode),
        mode,
    )


def _resolved(directory: Path | None) -> Path | None:
    return directory.resolve() if directory is not None else None
