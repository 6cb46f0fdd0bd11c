"""Debian's headless Chromium, driven through its chromedriver by selenium, for the page's tests.

The browser is the system's (``apt-get install chromium chromium-driver``, as ``.ci/run`` does):
nothing is downloaded at test time, so selenium is handed both paths and never runs its own
driver manager. Without them the tests that need a browser are skipped, naming the packages.

Screenshots go to the test's temp dir (``screenshot``), where CI keeps them as artifacts.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

# Big enough for the page's wide tables, small enough for a screenshot in the README.
WINDOW = (1280, 860)


def require_chromium() -> None:
    """Skip the calling test when the system browser or its driver is missing."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install, as .ci/run)")


@contextmanager
def open_browser(profile: Path, arguments: Sequence[str] = ()) -> Iterator:
    """A headless Chromium with a fresh profile under ``profile`` (and ``arguments`` besides the
    usual ones); quit on leaving, however left.

    Runs without the sandbox (CI runs as root, where Chromium's sandbox cannot start) and with
    ``/tmp`` for shared memory (a container's ``/dev/shm`` is small)."""
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--user-data-dir={profile}",
        *arguments,
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver, directory: Path, name: str) -> Path:
    """Save the current screen as ``<directory>/<name>.png`` and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
