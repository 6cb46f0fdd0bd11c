"""The README as the tests read it: a section's shell blocks, the `pick` helper, and a way to run
the README's lines as a reader's shell does (bash, stopping at the first failure)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def section_text(heading: str) -> str:
    """The README's text from ``heading`` (a whole heading line, e.g. ``"## Graphs"``) up to the
    next heading of the same level or above."""
    text = README.read_text()
    start = text.index(f"\n{heading}\n") + 1
    level = heading.split(" ", 1)[0]
    ends = [
        text.find(f"\n{'#' * depth} ", start + len(heading)) for depth in range(2, len(level) + 1)
    ]
    ends = [end for end in ends if end != -1]
    return text[start : min(ends)] if ends else text[start:]


def sh_blocks(heading: str) -> list[str]:
    """The ```sh blocks of that section, in order, each stripped."""
    return [
        block.strip() for block in re.findall(r"```sh\n(.*?)```", section_text(heading), re.DOTALL)
    ]


def pick_helper() -> str:
    """The one-line ``pick() { ... }`` the README defines for its curl examples."""
    return next(line for line in README.read_text().splitlines() if line.startswith("pick() {"))


def shell(lines: list[str], env: dict, *, timeout: float) -> subprocess.CompletedProcess:
    """Run ``lines`` in bash from the repository root as a reader would (``-euo pipefail``)."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(lines)],
        check=False,
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
