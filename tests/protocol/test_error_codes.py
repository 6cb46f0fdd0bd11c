"""The one error-code table: it agrees with the control-plane spec's, every refusal names a code
from it, and no call site or error class pairs a code with a status of its own.

The spec is read where the project keeps it (``SALVOR_CONTROL_PLANE_SPEC`` names another copy);
its "Error envelope" table is parsed, never copied here.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re
from pathlib import Path

import pytest
import salvor.daemon
import salvor.store
from salvor.daemon.web import OperationRefused
from salvor.protocol import ERROR_STATUS, PLAIN_WORDING, CodedError, ErrorCode, NextStep, StepKind

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for top in ("protocol", "store", "daemon") for p in (ROOT / top).rglob("*.py"))
_ROW = re.compile(r"^\|\s*(\d{3})\s*\|\s*`([a-z_]+)`\s*\|")


def spec_path() -> Path | None:
    named = os.environ.get("SALVOR_CONTROL_PLANE_SPEC")
    candidates = (
        [Path(named)]
        if named
        else [
            up / "shared" / "spec" / "control-plane-api.md" for up in (ROOT.parent, ROOT.parents[1])
        ]
    )
    return next((p for p in candidates if p.is_file()), None)


def spec_codes(text: str) -> dict[str, int]:
    """code -> status from the rows of the spec's "Error envelope" section."""
    section = text.partition("## Error envelope")[2].partition("\n## ")[0]
    return {m.group(2): int(m.group(1)) for line in section.splitlines() if (m := _ROW.match(line))}


def test_each_code_has_one_status_and_the_wire_sees_the_bare_token() -> None:
    assert len({code.value for code in ErrorCode}) == len(ErrorCode) == len(ERROR_STATUS)
    for code, status in ERROR_STATUS.items():
        assert code.status == status and 400 <= status <= 599, code
        assert ErrorCode(code.value) is code and str(code) == code.value


def test_the_table_matches_the_spec_for_every_code_the_spec_names() -> None:
    path = spec_path()
    if path is None:
        pytest.skip(
            "the control-plane spec is not beside this checkout; set SALVOR_CONTROL_PLANE_SPEC"
        )
    named = spec_codes(path.read_text())
    assert len(named) >= 20, (
        f"found only {sorted(named)} in {path}: has the table's layout changed?"
    )
    ours = {code.value: code.status for code in ErrorCode}
    assert {code: ours.get(code) for code in named} == named


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name
    ]


def _is_member(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "ErrorCode"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_refusal_names_a_code_of_the_table_and_no_status_of_its_own(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if _is_member(node):
            assert hasattr(ErrorCode, node.attr), (
                f"{path.name}:{node.lineno}: no ErrorCode.{node.attr}"
            )
    for call in _calls(tree, "OperationRefused"):
        # A variable holding a member passes (the constructor refuses anything else at run time).
        assert call.args and not isinstance(call.args[0], ast.Constant), (
            f"{path.name}:{call.lineno}: name the code as ErrorCode.X"
        )
        assert len(call.args) == 2, (
            f"{path.name}:{call.lineno}: the status comes from the table, not the call"
        )


def test_a_refusal_refuses_a_bare_string_for_its_code() -> None:
    with pytest.raises(TypeError, match="ErrorCode"):
        OperationRefused("run_exists", "run r already has history")  # type: ignore[arg-type]
    assert OperationRefused(ErrorCode.RUN_EXISTS, "r").to_json() == {
        "error": {"code": "run_exists", "message": "r"}
    }
    assert OperationRefused(ErrorCode.RUN_EXISTS, "r").status == 409


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    return found.union(*(_subclasses(sub) for sub in found)) if found else found


def test_every_error_class_carries_a_code_of_the_table() -> None:
    for package in (salvor.store, salvor.daemon):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not module.name.endswith("__main__"):
                importlib.import_module(module.name)
    classes = _subclasses(CodedError)
    assert len(classes) >= 10
    for cls in classes:
        assert isinstance(cls.code, ErrorCode), cls
        assert cls.status is CodedError.status, (
            f"{cls.__name__} overrides the status the table gives its code"
        )


# -- a refusal's next step: data, worded by each surface ------------------------------------------


def test_a_next_step_needs_what_its_kind_acts_on() -> None:
    with pytest.raises(TypeError, match="needs run"):
        NextStep(kind=StepKind.RESOLVE_WRITE)
    with pytest.raises(TypeError, match="needs run, wake_at"):
        NextStep(kind=StepKind.AWAIT_WAKE)
    assert NextStep(kind=StepKind.REGISTER_AGENT).run is None


def test_a_refusal_words_its_next_step_as_each_surface_asks() -> None:
    step = NextStep(kind=StepKind.RESUME_RUN, run="r-1")
    refusal = OperationRefused(
        ErrorCode.WRONG_STATE, "run r-1 has no dangling write", next_step=step
    )
    shout = {kind: (lambda s: f"DO {s.kind} TO {s.run}") for kind in StepKind}
    assert refusal.sentence(shout) == "run r-1 has no dangling write; DO resume_run TO r-1"
    assert refusal.to_json(shout)["error"]["message"] == refusal.sentence(shout)
    # Without a surface: plain words, in ``message`` and the default envelope alike.
    assert refusal.message == refusal.sentence(PLAIN_WORDING) == str(refusal)
    assert refusal.to_json()["error"]["message"] == refusal.message
    assert refusal.message.startswith("run r-1 has no dangling write; ")
    bare = OperationRefused(ErrorCode.WRONG_STATE, "nothing to do")
    assert bare.sentence(shout) == bare.message == "nothing to do"


def test_every_wording_words_every_kind_of_step() -> None:
    from salvor.daemon.cli._wording import CLI_WORDING
    from salvor.daemon.web import HTTP_WORDING

    steps = [
        NextStep(kind=kind, run="r-1", wake_at="2099-01-01T00:00:00Z", tool="charge")
        for kind in StepKind
    ]
    for wording in (PLAIN_WORDING, HTTP_WORDING, CLI_WORDING):
        assert set(wording) == set(StepKind)
        for step in steps:
            assert wording[step.kind](step).strip()
    for step in steps:
        assert "salvor " not in HTTP_WORDING[step.kind](step)
        assert "/v1/" not in CLI_WORDING[step.kind](step)
