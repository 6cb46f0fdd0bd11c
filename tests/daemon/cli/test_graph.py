"""``salvor graph validate FILE``, run in this process (a subprocess per case would cost the suite
a second of CPU each): its lines, its exit statuses, and its ``--json`` being the answer of
``POST /v1/graphs/validate`` for the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from salvor.daemon.cli import _main
from salvor.daemon.cli._parser import command_parser

from tests.support.api_server import Server
from tests.support.backends import SQLITE_ONLY
from tests.support.graph_documents import EVERY_KIND_YAML, every_kind, three_defects

# What it tests is the command's sentences; the one test over HTTP stores nothing.
STORE_BACKENDS = SQLITE_ONLY
VALID_LINE = (
    "valid: sha256:dd561be4f8a81d2f08a38166473a3f7a431899c0ec832a4124862c78e7e6bde6 "
    "(8 nodes, 5 edges)"
)


@pytest.fixture
def salvor(monkeypatch, capsys):
    """``salvor ARGS...`` through the real entry point: (exit status, stdout, stderr)."""
    # The entry point makes its process undumpable; this process is the test runner's.
    monkeypatch.setattr(_main, "make_undumpable", lambda: False)

    def run(*args: str) -> tuple[int, str, str]:
        code = _main.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_valid_document_prints_its_hash_and_size(salvor, tmp_path: Path) -> None:
    as_yaml = write(tmp_path / "publishing.yml", EVERY_KIND_YAML)
    as_json = write(tmp_path / "publishing.json", json.dumps(every_kind()))
    # No telling suffix: JSON is told by its brace, anything else is read as YAML.
    sniffed_json = write(tmp_path / "graph.txt", "\n  " + json.dumps(every_kind()))
    sniffed_yaml = write(tmp_path / "graph", EVERY_KIND_YAML)
    for path in (as_yaml, as_json, sniffed_json, sniffed_yaml):
        assert salvor("graph", "validate", path) == (0, VALID_LINE + "\n", ""), path


def test_an_invalid_document_prints_every_error_one_a_line(salvor, tmp_path: Path) -> None:
    document, _ = three_defects()
    code, out, err = salvor("graph", "validate", write(tmp_path / "g.json", json.dumps(document)))
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        (
            "blank_node_name research: nodes[0] ('research'): the name is blank; "
            "omit it or give it a word"
        ),
        "duplicate_node_id tally: nodes[8]: the id 'tally' is used by an earlier node",
        (
            "dangling_edge tally -> publsh: edges[5] (tally -> publsh): there is no node 'publsh' "
            "(did you mean publish?)"
        ),
    ]


def test_a_yaml_error_names_its_line_and_column(salvor, tmp_path: Path) -> None:
    broken = EVERY_KIND_YAML.replace("    kind: map\n", "    kind: map\n   over: [\n", 1)
    code, out, _ = salvor("graph", "validate", write(tmp_path / "g.yaml", broken))
    (line,) = out.splitlines()
    assert code == 1 and line.startswith("malformed_document: ")
    # The stray line is the one after `kind: map` (line 25), indented by three spaces.
    assert "line 26, column 4" in line, line
    # The same text named .json is read as JSON, and is no JSON at all.
    code, out, _ = salvor("graph", "validate", write(tmp_path / "g.json", broken))
    assert code == 1 and out.startswith("malformed_document: ") and "JSON" in out


def test_an_unreadable_file_is_one_sentence_and_exit_2(salvor, tmp_path: Path) -> None:
    for path in (tmp_path / "missing.yaml", tmp_path):
        code, out, err = salvor("graph", "validate", str(path))
        assert (code, out) == (2, "")
        (line,) = err.splitlines()
        assert line.startswith(f"salvor: cannot read graph file {str(path)!r}: ")


async def test_json_is_the_answer_of_the_validate_endpoint(server: Server, tmp_path: Path) -> None:
    """``--json`` through the parser and the verb in this trio loop (the entry point would start
    a loop of its own), beside the daemon's answer for the same bytes."""
    import contextlib
    import io

    from salvor.daemon.cli._graph import validate_main

    for name, text in (
        ("good.yaml", EVERY_KIND_YAML),
        ("bad.json", json.dumps(three_defects()[0])),
        ("broken.yaml", "nodes: [\n"),
    ):
        path = write(tmp_path / name, text)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = await validate_main(
                command_parser().parse_args(["graph", "validate", path, "--json"])
            )
        media = "application/yaml" if name.endswith(".yaml") else "application/json"
        answer = await server.client.post(
            "/v1/graphs/validate", content=text.encode(), headers={"Content-Type": media}
        )
        assert json.loads(printed.getvalue()) == answer.json(), name
        assert code == (0 if answer.json()["valid"] else 1)
