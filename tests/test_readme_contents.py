"""The README's table of contents lists every section and sub-section, each link where it says.

A newcomer finds a section from the contents; a heading renamed or added without its line there
would send them nowhere. On a mismatch the failure prints the whole block to paste in.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
CONTENTS = "## Contents"


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.lower())
    return text.replace(" ", "-")


def expected_contents(readme: str) -> list[str]:
    lines = []
    in_code = False
    for line in readme.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or line == CONTENTS:
            continue
        if match := re.match(r"(##+) (.*)", line):
            depth, title = len(match[1]) - 2, match[2]
            lines.append(f"{'  ' * depth}- [{title}](#{anchor(title)})")
    return lines


def written_contents(readme: str) -> list[str]:
    block = readme.split(f"\n{CONTENTS}\n\n", 1)[1].split("\n\n", 1)[0]
    return block.splitlines()


def test_the_contents_list_every_heading_in_order():
    readme = README.read_text()
    expected = expected_contents(readme)
    assert written_contents(readme) == expected, "the README's contents should read:\n" + "\n".join(
        expected
    )


def test_the_anchor_is_github_s():
    assert anchor("Flow tools: agents that ask, delegate and finish") == (
        "flow-tools-agents-that-ask-delegate-and-finish"
    )
    assert anchor("A local agent process: `salvor doctor`") == "a-local-agent-process-salvor-doctor"
    assert anchor("Your own loop, salvor's log: client-driven runs") == (
        "your-own-loop-salvors-log-client-driven-runs"
    )
