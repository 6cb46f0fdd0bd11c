"""Reading one of the page's files by name: only plain names of the folder's own files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from salvor.daemon.dashboard import CONTENT_TYPES, INDEX, read_asset
from salvor.daemon.dashboard._assets import STATIC

SHIPPED = sorted(p.name for p in STATIC.iterdir() if p.suffix in CONTENT_TYPES)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_file_is_read_with_its_content_type(name: str) -> None:
    asset = read_asset(name)
    assert asset is not None and asset.body == (STATIC / name).read_bytes()
    assert asset.content_type == CONTENT_TYPES[(STATIC / name).suffix]


def test_the_page_is_its_index_and_its_modules() -> None:
    assert INDEX in SHIPPED
    assert read_asset(INDEX).content_type == "text/html; charset=utf-8"
    assert read_asset("app.js").content_type == "text/javascript; charset=utf-8"
    assert read_asset("app.css").content_type == "text/css; charset=utf-8"


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../__init__.py",
        "..%2F__init__.py",
        "static/app.js",
        "/etc/passwd",
        ".hidden.js",
        "app.js/",
        "app",
        "app.js\x00.css",
        "a\\b.js",
        "nowhere.js",
        "_assets.py",
    ],
)
def test_a_name_outside_the_folder_or_of_no_page_kind_is_nothing(name: str) -> None:
    assert read_asset(name) is None


def test_a_link_in_the_folder_is_not_followed(tmp_path, monkeypatch) -> None:
    from salvor.daemon.dashboard import _assets

    secret = tmp_path / "secret.txt"
    secret.write_text("not the page's")
    folder = tmp_path / "static"
    folder.mkdir()
    (folder / "leak.js").symlink_to(secret)
    (folder / "real.js").write_text("export {};")
    monkeypatch.setattr(_assets, "STATIC", folder)
    assert read_asset("leak.js") is None
    assert read_asset("real.js").body == b"export {};"


def test_the_readme_shows_a_committed_screenshot_of_each_screen() -> None:
    repo = STATIC.parents[2]
    readme = (repo / "README.md").read_text()
    shown = re.findall(r"!\[[^\]]*\]\((docs/screenshots/[^)]+)\)", readme)
    assert {Path(path).stem for path in shown} >= {"runs", "run", "inbox", "graph"}
    for path in shown:
        assert (repo / path).read_bytes().startswith(b"\x89PNG"), path
