"""Claiming the daemon's Unix socket: what is already at the path, and the directory around it.

Real sockets and files in a temporary directory; the claim is the listener's first step (``salvor
serve --listen unix:PATH``), so a refusal here is one the command line prints as it is.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from salvor.daemon.web import UnixSocketRefused, claim_unix_socket


def test_a_stale_socket_is_replaced_by_one_only_its_user_can_open(tmp_path: Path) -> None:
    path = tmp_path / "salvor.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))  # bound, never listening: what a killed daemon leaves
    claimed = claim_unix_socket(str(path))
    try:
        info = os.lstat(path)
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        assert stat.S_IMODE(os.lstat(str(path) + ".lock").st_mode) == 0o600
    finally:
        claimed.release()
    assert not path.exists()


def test_a_live_daemons_socket_is_never_removed(tmp_path: Path) -> None:
    path = tmp_path / "salvor.sock"
    first = claim_unix_socket(str(path))
    try:
        with pytest.raises(UnixSocketRefused, match="another salvor serve listens"):
            claim_unix_socket(str(path))
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        first.release()


def test_what_is_not_a_stale_socket_of_ours_is_left_alone(tmp_path: Path) -> None:
    listening = tmp_path / "other.sock"
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(listening))
        other.listen()
        with pytest.raises(UnixSocketRefused, match="another program listens"):
            claim_unix_socket(str(listening))
        assert stat.S_ISSOCK(os.lstat(listening).st_mode)
    regular = tmp_path / "notes.txt"
    regular.write_text("keep me")
    with pytest.raises(UnixSocketRefused, match="is not a socket"):
        claim_unix_socket(str(regular))
    assert regular.read_text() == "keep me"


@pytest.mark.parametrize(
    ("directory_mode", "owner", "refusal"),
    [
        (0o777, None, "writable by other users"),
        (0o1777, None, None),  # sticky, as /tmp: others cannot remove or rename what is ours
        (0o755, 65534, "belongs to another user"),
    ],
)
def test_the_directory_must_be_one_others_cannot_swap_the_socket_in(
    tmp_path: Path, directory_mode: int, owner: int | None, refusal: str | None
) -> None:
    directory = tmp_path / "run"
    directory.mkdir()
    directory.chmod(directory_mode)
    if owner is not None:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(directory, owner, -1)
    path = directory / "salvor.sock"
    if refusal is None:
        claim_unix_socket(str(path)).release()
        return
    with pytest.raises(UnixSocketRefused, match=refusal):
        claim_unix_socket(str(path))
    assert not path.exists() and not Path(str(path) + ".lock").exists()
