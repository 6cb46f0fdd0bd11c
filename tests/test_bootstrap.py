"""``./bootstrap``, the README's install step, on the path a stock Debian or Ubuntu takes.

Their python3 has no ensurepip, so the script makes the environment without
pip and installs pip from PyPI's wheel, checked against PyPI's digest. Both
tests force that path (``SALVOR_BOOTSTRAP_WITHOUT_ENSUREPIP``) in a copy of
the files an install needs.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
import salvor

REPO = Path(__file__).resolve().parent.parent
PYPI_PIP = "https://pypi.org/pypi/pip/json"


def checkout_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "checkout"
    copy.mkdir()
    for name in ("bootstrap", "pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, copy / name)
    for package in ("salvor_ns", "protocol", "store", "daemon"):
        shutil.copytree(
            REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return copy


def run_bootstrap(checkout: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(checkout / "bootstrap"), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SALVOR_BOOTSTRAP_WITHOUT_ENSUREPIP": "1", **env},
    )


def pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen(PYPI_PIP, timeout=10):
            return True
    except OSError:
        return False


def test_a_pip_wheel_whose_digest_is_not_pypis_is_refused_and_nothing_installed(tmp_path):
    wheel = b"not the wheel PyPI published"
    release = {
        "urls": [
            {
                "filename": "pip-99.0-py3-none-any.whl",
                "url": "pip-99.0-py3-none-any.whl",
                "digests": {"sha256": hashlib.sha256(b"the published one").hexdigest()},
            }
        ]
    }

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            body = json.dumps(release).encode() if self.path.endswith("/json") else wheel
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        checkout = checkout_copy(tmp_path)
        result = run_bootstrap(
            checkout,
            ".",
            SALVOR_BOOTSTRAP_PIP_JSON=f"http://127.0.0.1:{server.server_port}/pypi/pip/json",
        )
    finally:
        server.shutdown()
    assert result.returncode != 0
    assert "does not match its published sha256; nothing installed" in result.stderr
    assert not (checkout / ".venv/bin/salvor").exists()


@pytest.mark.skipif(not pypi_reachable(), reason=f"PyPI is not reachable from here ({PYPI_PIP})")
def test_bootstrap_without_ensurepip_installs_pip_then_salvor_into_its_own_venv(tmp_path):
    checkout = checkout_copy(tmp_path)
    result = run_bootstrap(checkout, "--quiet", "--no-deps", ".")
    assert result.returncode == 0, result.stderr
    assert "this Python has no ensurepip" in result.stderr
    venv = checkout / ".venv"
    assert subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "--version"], capture_output=True, check=True
    ).stdout.startswith(b"pip ")
    # The distribution landed in the venv (--no-deps keeps the test short, so nothing is imported).
    found = subprocess.run(
        [
            str(venv / "bin/python"),
            "-c",
            "import importlib.metadata as m; print(m.version('salvor'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert found.strip() == salvor.__version__
    assert (venv / "bin/salvor").exists()
    # The checkout's own sources are compiled (checkout_copy leaves every __pycache__ out), so a
    # process that runs them need not compile them again where PYTHONDONTWRITEBYTECODE is set.
    for package in ("salvor_ns", "protocol", "store", "daemon/cli"):
        assert list((checkout / package / "__pycache__").glob("*.pyc")), package


def test_a_venv_place_that_is_some_other_directory_is_refused_and_left_as_it_was(tmp_path):
    checkout = checkout_copy(tmp_path)
    elsewhere = tmp_path / "opt"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not salvor's")
    result = run_bootstrap(checkout, ".", SALVOR_VENV=str(elsewhere))
    assert result.returncode == 1
    assert result.stderr == (
        f"bootstrap: {elsewhere} exists and is not a virtual environment; "
        "name an empty or new directory in SALVOR_VENV\n"
    )
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"]
