"""CI runs the README's two commands as the README prints them, character for character.

Milestone 2's CI installed with ``-e`` while the README's first command did not, and the first
command a newcomer typed failed with every test green. ``.ci/run`` names the two commands once, in
two shell assignments, and runs exactly those; this holds the assignments to the README's code
blocks and checks that each is what CI runs.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from tests.support.readme import sh_blocks

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    """The shell blocks of the README's "Two commands" section, in order."""
    return sh_blocks("## Two commands")


def ci_assignment(script: str, name: str) -> str:
    """The value a line ``NAME=...`` of the script gives, unquoted as the shell unquotes it."""
    (line,) = [line for line in script.splitlines() if line.startswith(f"{name}=")]
    (value,) = shlex.split(line.removeprefix(f"{name}="))
    return value


def ci_lines(path: str) -> list[str]:
    """A script's lines that run something (its comments left out)."""
    lines = (REPO / path).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_has_its_two_commands():
    first, second = readme_commands()
    assert first.startswith("./bootstrap . && ")
    assert second.startswith("./bootstrap -e ")


def test_ci_runs_the_readme_first_command_as_written():
    script = (REPO / ".ci/run").read_text()
    assert ci_assignment(script, "README_SERVE") == readme_commands()[0]
    # The smoke runs the command it is given under `sh -c`, untouched.
    assert any(
        line.startswith("timed .ci/smoke ") and line.endswith('"$README_SERVE"')
        for line in ci_lines(".ci/run")
    )
    assert any('sh -c "$COMMAND"' in line for line in ci_lines(".ci/smoke"))


def test_ci_runs_the_readme_test_command_as_written():
    script = (REPO / ".ci/run").read_text()
    assert ci_assignment(script, "README_TEST") == readme_commands()[1]
    assert 'sh -c "$README_TEST"' in ci_lines(".ci/run")
